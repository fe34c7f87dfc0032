/* Client side of the daemon's runtime socket (runtime_call.h). */
#define _GNU_SOURCE
#include "runtime_call.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

const char *gs_runtime_socket(char *buf, size_t cap)
{
    const char *control = getenv(GS_ENV_SOCKET);
    if (!control || !*control)
        control = GS_CONTROL_SOCKET;
    const char *slash = strrchr(control, '/');
    int dir = slash ? (int)(slash - control) : 1;
    snprintf(buf, cap, "%.*s/%s", dir, slash ? control : ".", GS_RUNTIME_SOCKET_NAME);
    return buf;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

char *gs_read_all(int fd, size_t *n)
{
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            free(buf);
            return NULL;
        }
        if (r == 0)
            break;
        len += (size_t)r;
        if (len == cap) {
            if (cap >= GS_INPUT_MAX) {
                free(buf);
                errno = EFBIG;
                return NULL;
            }
            char *bigger = realloc(buf, 2 * cap + 1);
            if (!bigger)
                free(buf);
            buf = bigger;
            cap *= 2;
        }
    }
    if (!buf)
        return NULL;
    buf[len] = 0;
    *n = len;
    return buf;
}

static int no_answer(char *reply, size_t cap, const char *path, const char *what)
{
    snprintf(reply, cap, "no answer from the gpuslice daemon at %s (%s: %s)", path, what, strerror(errno));
    return -1;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* The daemon closed the connection without an answer (crowded out, or it
 * restarted): nothing was done, and the same request again may be answered. */
static int was_reset(void)
{
    return errno == ECONNRESET || errno == EPIPE || errno == EAGAIN || errno == ENODATA;
}

/* One connection: -1 with errno when there was no answer, else the bytes of
 * the reply in reply (NUL-terminated). */
static int attempt(const struct sockaddr_un *addr, double left, const char *verb, const char *const *keys,
                   const char *payload, size_t n, char *reply, size_t cap, const char **what)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        *what = "socket";
        return -1;
    }
    struct timeval tv = {(time_t)left, (suseconds_t)((left - (double)(time_t)left) * 1e6)};
    if (tv.tv_sec == 0 && tv.tv_usec == 0)
        tv.tv_usec = 1000;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    *what = "connect";
    int bad = connect(fd, (const struct sockaddr *)addr, sizeof *addr) != 0;
    if (!bad) {
        *what = "send";
        bad = write_all(fd, verb, strlen(verb)) || write_all(fd, "\n", 1);
        for (const char *const *k = keys; k && *k && !bad; k++)
            bad = write_all(fd, *k, strlen(*k)) || write_all(fd, "\n", 1);
        bad = bad || write_all(fd, "\n", 1) || (n && write_all(fd, payload, n)) || shutdown(fd, SHUT_WR) != 0;
    }
    size_t len = 0;
    while (!bad && len + 1 < cap) {
        *what = "receive";
        ssize_t r = recv(fd, reply + len, cap - 1 - len, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            bad = 1;
        else if (r == 0)
            break;
        else
            len += (size_t)r;
    }
    int saved = errno;
    close(fd);
    errno = saved;
    if (bad)
        return -1;
    if (len == 0) {
        errno = ENODATA; /* closed unanswered */
        return -1;
    }
    reply[len] = 0;
    return 0;
}

int gs_runtime_call(const char *verb, const char *const *keys, const char *payload, size_t n, char *reply,
                    size_t cap)
{
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    gs_runtime_socket(path, sizeof path);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path) {
        errno = ENAMETOOLONG;
        return no_answer(reply, cap, path, "socket path");
    }
    strcpy(addr.sun_path, path);
    /* A connection closed unanswered is tried again, backing off, within the
     * call's one deadline; a daemon that is not there (no socket, refused)
     * fails at once. */
    double until = now_s() + GS_CALL_TIMEOUT_S, pause = 0.005;
    const char *what = "connect";
    for (;;) {
        if (attempt(&addr, until - now_s(), verb, keys, payload, n, reply, cap, &what) == 0)
            break;
        if (!was_reset() || now_s() + pause >= until)
            return no_answer(reply, cap, path, what);
        struct timespec nap = {0, (long)(pause * 1e9)};
        nanosleep(&nap, NULL);
        pause = pause * 2 > 0.25 ? 0.25 : pause * 2;
    }
    reply[strcspn(reply, "\n")] = 0;
    if (strncmp(reply, "ok", 2) == 0 && (reply[2] == 0 || reply[2] == ' ')) {
        memmove(reply, reply + (reply[2] ? 3 : 2), strlen(reply + (reply[2] ? 3 : 2)) + 1);
        return 0;
    }
    if (strncmp(reply, "error ", 6) == 0) {
        memmove(reply, reply + 6, strlen(reply + 6) + 1);
        return 1;
    }
    errno = EPROTO;
    return no_answer(reply, cap, path, "reply");
}

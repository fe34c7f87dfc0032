/* gpuslice-hook createRuntime|poststop|update-ldcache: the OCI hook
 * (docs/oci-integration.md).  The OCI state comes on stdin; the daemon does
 * the work (reads config.json, reserves or finds the slice, binds, releases)
 * in one round trip on its runtime socket, so a container start pays for a
 * small C program, not for an interpreter and a gRPC stack.
 *
 * createRuntime: any failure aborts the container's creation with one line
 * and leaves nothing reserved.  poststop: failures are warnings (exit 0); the
 * daemon's sweep reclaims what is left.  update-ldcache (createContainer): the
 * container's loader cache learns the interposer's and the driver's
 * directories, ahead of any the image lists; it is how the container's
 * programs find the slice's libcuda.so.1 (the spec sets no LD_LIBRARY_PATH,
 * which would replace the image's own), so a failure aborts the container
 * with one line. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "runtime_call.h"

#define NDIRS 2
#define LOCK_WAIT_MS 10000 /* another container's ldconfig on a shared root: well under a second */
/* ldconfig on an image's root: under a second; an /etc/ld.so.conf that is a FIFO, or a root on a
 * stalled filesystem, holds it for good, and with it the runtime's create and the lock */
#define LDCONFIG_WAIT_MS 20000
/* where the CDI spec mounts the interposer and the real driver in a container */
static const char *const LIB_DIRS[NDIRS] = {GS_CONTAINER_WRAP_DIR, GS_CONTAINER_DRIVER_DIR};
static const char *const LDCONFIG[] = {"/sbin/ldconfig", "/usr/sbin/ldconfig", "/bin/ldconfig", "/usr/bin/ldconfig"};

/* Opens dir `name` under `at`, making it if missing; never follows a symlink,
 * so an image's links cannot send the write outside its root. */
static int subdir(int at, const char *name)
{
    if (at < 0 || (mkdirat(at, name, 0755) != 0 && errno != EEXIST))
        return -1;
    return openat(at, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

static void close_all(const int *fds, int n)
{
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

/* Takes the lock on an open file, waiting at most LOCK_WAIT_MS; 0 or an errno. */
static int lock_bounded(int fd)
{
    const struct timespec step = {0, 10 * 1000 * 1000};
    for (int waited = 0; flock(fd, LOCK_EX | LOCK_NB) != 0; waited += 10) {
        if (errno != EWOULDBLOCK || waited >= LOCK_WAIT_MS)
            return errno == EWOULDBLOCK ? ETIMEDOUT : errno;
        nanosleep(&step, NULL);
    }
    return 0;
}

#define NOT_A_FILE (-100000) /* write_conf: the image has something else by that name */

/* <root>/etc/ld.so.conf.d/00-gpuslice.conf, written and left open and locked:
 * the caller runs ldconfig under the lock, since containers that share a root
 * (Podman's --rootfs) start together, and ldconfig runs on one root at once
 * fail to rename the cache's temporary file.  The open fd, -errno, or
 * NOT_A_FILE: an image's FIFO by that name held the open for good, and a
 * device node's open is the device's. */
static int write_conf(const char *root)
{
    int fds[4] = {-1, -1, -1, -1};
    fds[0] = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    fds[1] = subdir(fds[0], "etc");
    fds[2] = subdir(fds[1], "ld.so.conf.d");
    if (fds[2] >= 0) {
        struct stat st;
        if (fstatat(fds[2], "00-gpuslice.conf", &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode)) {
            close_all(fds, 3);
            return NOT_A_FILE;
        }
        /* O_NONBLOCK: a FIFO put there since is refused, not waited on */
        fds[3] = openat(fds[2], "00-gpuslice.conf", O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    }
    int err = fds[3] < 0 ? errno : lock_bounded(fds[3]);
    if (!err && ftruncate(fds[3], 0) != 0)
        err = errno;
    for (int i = 0; !err && i < NDIRS; i++)
        if (dprintf(fds[3], "%s\n", LIB_DIRS[i]) < 0)
            err = errno ? errno : EIO;
    close_all(fds, err ? 4 : 3);
    return err ? -err : fds[3];
}

static long long now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000LL + t.tv_nsec / 1000000;
}

/* The first line of what the child wrote on `fd`, into why (bounded); the rest
 * is read and dropped, until the child closes it or the deadline. */
static void first_line(int fd, char *why, size_t cap, long long deadline)
{
    size_t n = 0;
    char sink[256];
    int ended = 0;
    for (long long left; !ended && (left = deadline - now_ms()) > 0;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, (int)left);
        if (r < 0 && errno != EINTR)
            break;
        if (r <= 0)
            continue;
        char *to = n + 1 < cap ? why + n : sink;
        size_t room = n + 1 < cap ? cap - 1 - n : sizeof sink;
        ssize_t got = read(fd, to, room);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            ended = 1;
        else if (to != sink)
            n += (size_t)got;
    }
    why[n] = '\0';
    why[strcspn(why, "\n")] = '\0';
}

/* The child's exit status, waited for until the deadline; -1 (the child killed
 * and reaped) after it, -2 (errno set) where it cannot be waited for. */
static int wait_bounded(pid_t pid, long long deadline)
{
    const struct timespec step = {0, 5 * 1000 * 1000};
    int status = 0;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return status;
        if (r < 0 && errno != EINTR)
            return -2;
        if (now_ms() >= deadline) {
            kill(pid, SIGKILL); /* our own child, not yet reaped: its pid is still its own */
            waitpid(pid, &status, 0);
            return -1;
        }
        nanosleep(&step, NULL);
    }
}

/* ldconfig -r ROOT DIRS...: the directories on the command line too, since
 * many images have no /etc/ld.so.conf, and because ldconfig puts them in the
 * cache before the configured ones: the loader takes the first entry of a
 * soname, so an image's own libcuda.so.1 (a CUDA compat directory in its
 * ld.so.conf.d) comes after the interposer.  0, or a reason in why. */
static int run_ldconfig(const char *root, char *why, size_t cap)
{
    const char *ldconfig = NULL;
    for (size_t i = 0; !ldconfig && i < sizeof LDCONFIG / sizeof *LDCONFIG; i++)
        if (access(LDCONFIG[i], X_OK) == 0)
            ldconfig = LDCONFIG[i];
    if (!ldconfig) {
        snprintf(why, cap, "no ldconfig in /sbin, /usr/sbin, /bin or /usr/bin");
        return -1;
    }
    int err[2];
    if (pipe2(err, O_CLOEXEC) != 0) {
        snprintf(why, cap, "cannot run %s: %s", ldconfig, strerror(errno));
        return -1;
    }
    signal(SIGCHLD, SIG_DFL); /* an ignored SIGCHLD (inherited from the runtime) reaps it unseen */
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0)
            dup2(null, 1);
        dup2(err[1], 2);
        char *argv[] = {(char *)ldconfig, "-r", (char *)root, (char *)LIB_DIRS[0], (char *)LIB_DIRS[1], NULL};
        execv(ldconfig, argv);
        _exit(127);
    }
    close(err[1]);
    if (pid < 0) {
        snprintf(why, cap, "cannot run %s: %s", ldconfig, strerror(errno));
        close(err[0]);
        return -1;
    }
    char said[256] = "";
    long long deadline = now_ms() + LDCONFIG_WAIT_MS;
    first_line(err[0], said, sizeof said, deadline);
    close(err[0]);
    int status = wait_bounded(pid, deadline);
    if (status == -2) {
        snprintf(why, cap, "cannot wait for %s: %s", ldconfig, strerror(errno));
        return -1;
    }
    if (status < 0) {
        snprintf(why, cap, "%s -r %s did not finish within %d s (stopped)", ldconfig, root, LDCONFIG_WAIT_MS / 1000);
        return -1;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        snprintf(why, cap, "%s -r %s failed (status %d)", ldconfig, root, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        size_t n = strlen(why);
        if (*said && n + 2 < cap) { /* ldconfig's reason, as much as fits */
            size_t k = strnlen(said, cap - 3 - n);
            memcpy(why + n, ": ", 2);
            memcpy(why + n + 2, said, k);
            why[n + 2 + k] = '\0';
        }
        return -1;
    }
    return 0;
}

static int update_ldcache(const char *state, size_t n)
{
    char reply[GS_REPLY_MAX], why[GS_REPLY_MAX + 128];
    int r = gs_runtime_call("ldcache-root", NULL, state, n, reply, sizeof reply);
    if (r == 0 && !*reply)
        return 0; /* the daemon found nothing to do */
    if (r != 0) {
        snprintf(why, sizeof why, "%s", reply);
    } else {
        int conf = write_conf(reply);
        if (conf == NOT_A_FILE) {
            snprintf(why, sizeof why, "%s/etc/ld.so.conf.d/00-gpuslice.conf is not a regular file", reply);
        } else if (conf < 0) {
            snprintf(why, sizeof why, "cannot write %s/etc/ld.so.conf.d/00-gpuslice.conf: %s", reply, strerror(-conf));
        } else {
            int r = run_ldconfig(reply, why, sizeof why);
            close(conf); /* the lock goes with it */
            if (r == 0)
                return 0;
        }
    }
    fprintf(stderr, "gpuslice-hook: update-ldcache: %s; without it the container's programs cannot find the "
                    "libcuda.so.1 its CDI spec mounts\n", why);
    return 1;
}

int main(int argc, char **argv)
{
    const char *stage = argc == 2 ? argv[1] : "";
    int poststop = strcmp(stage, "poststop") == 0;
    if (!poststop && strcmp(stage, "createRuntime") != 0 && strcmp(stage, "update-ldcache") != 0) {
        fprintf(stderr, "gpuslice-hook: usage: gpuslice-hook createRuntime|poststop|update-ldcache "
                        "(OCI state on stdin)\n");
        return 2;
    }
    size_t n = 0;
    char *state = gs_read_all(0, &n);
    if (!state) {
        fprintf(stderr, "gpuslice-hook: cannot read the OCI state on stdin: %s\n", strerror(errno));
        return 1;
    }
    if (strcmp(stage, "update-ldcache") == 0) {
        int r = update_ldcache(state, n);
        free(state);
        return r;
    }
    char reply[GS_REPLY_MAX];
    int r = gs_runtime_call(stage, NULL, state, n, reply, sizeof reply);
    free(state);
    if (r == 0)
        return 0;
    fprintf(stderr, "gpuslice-hook: %s\n", reply);
    return poststop ? 0 : 1;
}

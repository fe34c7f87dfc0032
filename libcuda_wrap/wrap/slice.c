/* This process's slice: asked for once over the slice socket (the protocol in
 * gpuslice_slice.h), then two shared mappings: limits read-only, usage
 * read-write.  All syscalls happen here, at first use, never on hot paths. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "wrap.h"


struct gs_slice gs;
static pthread_mutex_t attach_mu = PTHREAD_MUTEX_INITIALIZER;

static void after_fork_child(void)
{
    /* The child is another process: it attaches itself when it calls cuInit,
     * and gets its own row; what the parent holds stays the parent's. */
    pthread_mutex_init(&attach_mu, NULL);
    if (gs.limits)
        munmap((void *)gs.limits, sizeof *gs.limits);
    if (gs.usage)
        munmap(gs.usage, sizeof *gs.usage);
    memset(&gs, 0, sizeof gs);
    gs_table_reset();
    if (gs_contexts_forget) /* only the CUDA interposer caches contexts */
        gs_contexts_forget();
}

__attribute__((constructor)) static void slice_ctor(void)
{
    pthread_atfork(NULL, NULL, after_fork_child);
}

static int refuse(const char *why, const char *path)
{
    gs_log(1, "no GPU slice for this process: %s (%s); the GPU stays unavailable. "
              "For development without a daemon set GPUSLICE_ALLOW_UNSLICED=1",
           why, path);
    __atomic_store_n(&gs.mode, GS_REFUSED, __ATOMIC_RELEASE);
    return -1;
}

static int ask(const char *path, struct gpuslice_reply *rep, int fds[2])
{
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return -1;
    /* bounded: connect (a full backlog), write and recvmsg give up with EAGAIN */
    struct timeval limit = {.tv_sec = GS_SLICE_TIMEOUT_S};
    if (setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit) != 0 ||
        setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit) != 0) {
        int e = errno;
        close(s);
        errno = e;
        return -1;
    }
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path);
    struct gpuslice_request req = {GPUSLICE_REQUEST_MAGIC, GPUSLICE_SLICE_VERSION, GPUSLICE_OP_ATTACH};
    if (connect(s, (struct sockaddr *)&addr, sizeof addr) != 0 || write(s, &req, sizeof req) != sizeof req) {
        int e = errno;
        close(s);
        errno = e;
        return -1;
    }
    char control[CMSG_SPACE(2 * sizeof(int))];
    struct iovec iov = {rep, sizeof *rep};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
    ssize_t n = recvmsg(s, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC);
    int e = errno;
    close(s);
    if (n != (ssize_t)sizeof *rep) {
        errno = n < 0 ? e : EPROTO;
        return -1;
    }
    fds[0] = fds[1] = -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(2 * sizeof(int)))
            memcpy(fds, CMSG_DATA(c), 2 * sizeof(int));
    return 0;
}

int gs_attach(void)
{
    int mode = __atomic_load_n(&gs.mode, __ATOMIC_ACQUIRE);
    if (mode == GS_SLICE || mode == GS_UNSLICED)
        return 0;
    pthread_mutex_lock(&attach_mu);
    int rc = 0;
    mode = gs.mode;
    if (mode == GS_SLICE || mode == GS_UNSLICED)
        goto out;
    const char *allow = getenv("GPUSLICE_ALLOW_UNSLICED");
    if (allow && *allow && *allow != '0') {
        gs_log(1, "GPUSLICE_ALLOW_UNSLICED is set: no limits are enforced in this process");
        __atomic_store_n(&gs.mode, GS_UNSLICED, __ATOMIC_RELEASE);
        goto out;
    }
    const char *path = getenv(GS_ENV_SLICE_SOCKET);
    path = path && *path ? path : GS_SLICE_SOCKET;
    struct gpuslice_reply rep;
    int fds[2];
    if (ask(path, &rep, fds) != 0) {
        char why[160];
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINPROGRESS)
            snprintf(why, sizeof why, "the gpuslice daemon did not answer within %d s", GS_SLICE_TIMEOUT_S);
        else
            snprintf(why, sizeof why, "cannot reach the gpuslice daemon: %s", strerror(errno));
        rc = refuse(why, path);
        goto out;
    }
    rep.message[sizeof rep.message - 1] = 0;
    if (rep.magic != GPUSLICE_REPLY_MAGIC || rep.status != GPUSLICE_OK || fds[0] < 0 || fds[1] < 0) {
        if (fds[0] >= 0)
            close(fds[0]);
        if (fds[1] >= 0)
            close(fds[1]);
        rc = refuse(rep.magic == GPUSLICE_REPLY_MAGIC ? rep.message : "not a gpuslice reply", path);
        goto out;
    }
    void *lim = mmap(NULL, sizeof *gs.limits, PROT_READ, MAP_SHARED, fds[0], 0);
    void *use = mmap(NULL, sizeof *gs.usage, PROT_READ | PROT_WRITE, MAP_SHARED, fds[1], 0);
    close(fds[0]);
    close(fds[1]);
    if (lim == MAP_FAILED || use == MAP_FAILED) {
        if (lim != MAP_FAILED)
            munmap(lim, sizeof *gs.limits);
        if (use != MAP_FAILED)
            munmap(use, sizeof *gs.usage);
        rc = refuse("cannot map the slice's ledger", path);
        goto out;
    }
    gs.limits = lim;
    gs.usage = use;
    gs.slot = rep.proc_slot;
    __atomic_store_n(&gs.usage->proc[gs.slot].ns_pid, (int32_t)getpid(), __ATOMIC_RELEASE);
    __atomic_store_n(&gs.mode, GS_SLICE, __ATOMIC_RELEASE);
    gs_log(0, "attached to slice %.40s as row %u", gs.limits->slice_id, gs.slot);
out:
    pthread_mutex_unlock(&attach_mu);
    return rc;
}

int gs_gpu_of_uuid_text(const char *uuid)
{
    if (gs.mode != GS_SLICE)
        return -1;
    for (uint32_t g = 0; g < gs.limits->gpu_count && g < GPUSLICE_SLICE_MAX_GPUS; g++)
        if (strncasecmp(gs.limits->gpu[g].uuid, uuid, sizeof gs.limits->gpu[g].uuid) == 0)
            return (int)g;
    return -1;
}

int gs_gpu_of_uuid(const unsigned char b[16])
{
    char text[48];
    snprintf(text, sizeof text, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    return gs_gpu_of_uuid_text(text);
}

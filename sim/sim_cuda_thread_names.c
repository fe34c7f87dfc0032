/* Simulated driver: cuInit names the driver's threads, as the real driver does
 * since 570, by writing /proc/<getpid()>/task/<gettid()>/comm, and treats a
 * failed write as fatal (CUDA_ERROR_OPERATING_SYSTEM). getpid() and gettid()
 * are the caller's pid namespace's numbers, so a process in a new pid namespace
 * that still sees the host's /proc fails cuInit here exactly as on a real node
 * (seen on an H200, driver 580; nolabs-ai/nono #924, NVIDIA/OpenShell #710).
 * The simulator writes the thread's own name back: nothing visible changes. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>
#include "sim_cuda.h"

static int name_thread(void)
{
    char path[64];
    char name[17] = "";
    snprintf(path, sizeof path, "/proc/%d/task/%d/comm", (int)getpid(), (int)gettid());
    if (prctl(PR_GET_NAME, name, 0, 0, 0) != 0)
        return -1;
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, name, strlen(name));
    close(fd);
    return n < 0 ? -1 : 0;
}

CUresult sim_name_driver_threads(void)
{
    /* once per process, as the real driver starts its threads once; the
     * answer stays: a failed cuInit fails again */
    static int state; /* 0 not tried, 1 named, 2 failed */
    int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (s == 0) {
        s = name_thread() == 0 ? 1 : 2;
        __atomic_store_n(&state, s, __ATOMIC_RELEASE);
    }
    return s == 1 ? CUDA_SUCCESS : CUDA_ERROR_OPERATING_SYSTEM;
}

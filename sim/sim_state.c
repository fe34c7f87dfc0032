/* The shared state of the simulated machine: one mmap'ed file per state
 * directory, process slots whose liveness is an OFD lock, and the per-GPU
 * memory counter and utilisation buckets (the schedule: sim_schedule.c). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sim_state.h"

struct sim_shared *sim_shm;
static pthread_mutex_t attach_lock = PTHREAD_MUTEX_INITIALIZER;
static int lock_fd = -1;
static char lock_path[4200];
static int self_slot = -1;
static pid_t self_pid;

void sim_log(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if (n > (int)sizeof buf - 2)
        n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    /* one write() so concurrent processes do not interleave lines */
    ssize_t w = write(STDERR_FILENO, "gpuslice-sim: ", 14);
    w = write(STDERR_FILENO, buf, (size_t)n);
    (void)w;
}

uint64_t sim_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void sim_sleep_until(uint64_t t_ns)
{
    struct timespec ts = {.tv_sec = (time_t)(t_ns / 1000000000ull), .tv_nsec = (long)(t_ns % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

static const char *state_dir(void)
{
    const char *d = getenv("GPUSLICE_SIM_STATE_DIR");
    return (d && *d) ? d : "/tmp/gpuslice-sim";
}

static uint64_t digest(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static void init_robust(pthread_mutex_t *m)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(m, &a);
    pthread_mutexattr_destroy(&a);
}

/* Build a fresh state file and move it into place atomically. */
static int create_state(const char *dir, const struct sim_machine *m, uint64_t dig, char *err, size_t errlen)
{
    char tmp[4200], final[4200];
    snprintf(tmp, sizeof tmp, "%s/machine.%d.tmp", dir, (int)getpid());
    snprintf(final, sizeof final, "%s/machine", dir);
    int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0 || ftruncate(fd, sizeof(struct sim_shared)) != 0) {
        snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    fchmod(fd, 0666);
    struct sim_shared *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (s == MAP_FAILED) {
        snprintf(err, errlen, "cannot map %s: %s", tmp, strerror(errno));
        unlink(tmp);
        return -1;
    }
    s->machine = *m;
    s->config_digest = dig;
    init_robust(&s->lock);
    for (int g = 0; g < SIM_MAX_GPUS; g++) {
        init_robust(&s->gpu[g].lock);
        s->gpu[g].running = -1;
    }
    s->layout_version = SIM_LAYOUT_VERSION;
    __atomic_store_n(&s->magic, SIM_MAGIC, __ATOMIC_RELEASE);
    munmap(s, sizeof *s);
    if (rename(tmp, final) != 0) {
        snprintf(err, errlen, "cannot create %s: %s", final, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

static int any_live_slot(struct sim_shared *s)
{
    for (int i = 0; i < SIM_MAX_PROCS; i++)
        if (__atomic_load_n(&s->proc[i].live, __ATOMIC_ACQUIRE) && sim_slot_alive(i))
            return 1;
    return 0;
}

static int map_state(const char *dir, struct sim_shared **out, char *err, size_t errlen)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/machine", dir);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 1 : (snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno)), -1);
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size != sizeof(struct sim_shared)) {
        close(fd);
        return 2; /* another layout: rebuild */
    }
    struct sim_shared *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (s == MAP_FAILED) {
        snprintf(err, errlen, "cannot map %s: %s", path, strerror(errno));
        return -1;
    }
    if (__atomic_load_n(&s->magic, __ATOMIC_ACQUIRE) != SIM_MAGIC || s->layout_version != SIM_LAYOUT_VERSION) {
        munmap(s, sizeof *s);
        return 2;
    }
    *out = s;
    return 0;
}

int sim_attach(char *err, size_t errlen)
{
    if (__atomic_load_n(&sim_shm, __ATOMIC_ACQUIRE))
        return 0;
    pthread_mutex_lock(&attach_lock);
    int rc = -1;
    if (sim_shm) {
        rc = 0;
        goto out;
    }
    struct sim_machine m;
    if (sim_config_load(sim_config_path(), &m, err, errlen))
        goto out;
    uint64_t dig = digest(&m, sizeof m);
    const char *dir = state_dir();
    if (mkdir(dir, 01777) == 0)
        chmod(dir, 01777);
    char gpath[4200];
    snprintf(lock_path, sizeof lock_path, "%s/procs.lock", dir);
    snprintf(gpath, sizeof gpath, "%s/init.lock", dir);
    if (lock_fd < 0)
        lock_fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    int init_fd = open(gpath, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (lock_fd < 0 || init_fd < 0) {
        snprintf(err, errlen, "cannot use state directory %s: %s (set GPUSLICE_SIM_STATE_DIR)", dir, strerror(errno));
        if (init_fd >= 0)
            close(init_fd);
        goto out;
    }
    fchmod(lock_fd, 0666);
    fchmod(init_fd, 0666);
    flock(init_fd, LOCK_EX); /* serialise creation across processes */
    struct sim_shared *s = NULL;
    for (int attempt = 0; attempt < 2 && !s; attempt++) {
        int m_rc = map_state(dir, &s, err, errlen);
        if (m_rc < 0)
            break;
        if (m_rc == 0 && s->config_digest != dig) {
            sim_shm = s; /* sim_slot_alive needs it */
            int busy = any_live_slot(s);
            sim_shm = NULL;
            if (busy) {
                sim_log("state in %s was made from another config and processes still use it; using it as is", dir);
            } else {
                munmap(s, sizeof *s);
                s = NULL;
                m_rc = 1;
            }
        }
        if (m_rc != 0 && create_state(dir, &m, dig, err, errlen))
            break;
    }
    flock(init_fd, LOCK_UN);
    close(init_fd);
    if (!s) {
        if (!*err)
            snprintf(err, errlen, "cannot set up state in %s", dir);
        goto out;
    }
    __atomic_store_n(&sim_shm, s, __ATOMIC_RELEASE);
    rc = 0;
out:
    pthread_mutex_unlock(&attach_lock);
    return rc;
}

const struct sim_machine *sim_machine(void)
{
    return &sim_shm->machine;
}

static void lock_robust(pthread_mutex_t *m, void (*repair)(int), int arg)
{
    int r = pthread_mutex_lock(m);
    if (r == EOWNERDEAD) {
        if (repair)
            repair(arg);
        pthread_mutex_consistent(m);
    }
}

/* A holder died inside the critical section: recount from the slots. */
static void repair_gpu(int g)
{
    uint64_t used = 0;
    struct sim_cg_limit *l = sim_shm->gpu[g].limits;
    for (int k = 0; k < SIM_MAX_CG_LIMITS; k++)
        l[k].used = 0;
    for (int i = 0; i < SIM_MAX_PROCS; i++)
        if (__atomic_load_n(&sim_shm->proc[i].live, __ATOMIC_ACQUIRE)) {
            used += sim_shm->proc[i].mem[g];
            struct sim_cg_limit *mine = sim_cg_limit_of(g, sim_shm->proc[i].cgroup);
            if (mine)
                mine->used += sim_shm->proc[i].mem[g];
        }
    sim_shm->gpu[g].used = used;
}

void sim_gpu_lock(int g)
{
    lock_robust(&sim_shm->gpu[g].lock, repair_gpu, g);
}

void sim_gpu_unlock(int g)
{
    pthread_mutex_unlock(&sim_shm->gpu[g].lock);
}

int sim_slot_alive(int slot)
{
    if (slot == self_slot && self_pid == getpid())
        return 1;
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = slot, .l_len = 1};
    int fd = lock_fd;
    if (fd < 0)
        return 1;
    if (fcntl(fd, F_OFD_GETLK, &fl) != 0)
        return 1; /* cannot tell: assume alive, never reclaim wrongly */
    return fl.l_type != F_UNLCK;
}

static void reclaim(int i)
{
    struct sim_proc *p = &sim_shm->proc[i];
    for (int g = 0; g < sim_shm->machine.gpu_count; g++) {
        sim_gpu_lock(g);
        sim_acct_record_end(g, i);
        sim_shm->gpu[g].used -= p->mem[g];
        sim_cg_uncharge(g, p->cgroup, p->mem[g]);
        p->mem[g] = 0;
        p->contexts[g] = 0;
        p->busy_total[g] = 0;
        memset(p->util[g], 0, sizeof p->util[g]);
        memset(&p->queue[g], 0, sizeof p->queue[g]); /* its context is gone, and its work with it */
        sim_gpu_unlock(g);
    }
    __atomic_store_n(&p->live, 0, __ATOMIC_RELEASE);
}

void sim_sweep_dead(void)
{
    if (!sim_shm)
        return;
    int any = 0;
    for (int i = 0; i < SIM_MAX_PROCS && !any; i++)
        any = __atomic_load_n(&sim_shm->proc[i].live, __ATOMIC_ACQUIRE) && !sim_slot_alive(i);
    if (!any)
        return;
    lock_robust(&sim_shm->lock, NULL, 0);
    for (int i = 0; i < SIM_MAX_PROCS; i++)
        if (__atomic_load_n(&sim_shm->proc[i].live, __ATOMIC_ACQUIRE) && !sim_slot_alive(i))
            reclaim(i);
    pthread_mutex_unlock(&sim_shm->lock);
}

static uint64_t pidns_inode(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* Does /proc/<pid> (ours) belong to pid namespace `ns` and have pid `nspid` there? */
static int proc_is(int pid, uint64_t ns, int32_t nspid)
{
    char path[64], line[256];
    struct stat st;
    snprintf(path, sizeof path, "/proc/%d/ns/pid", pid);
    if (stat(path, &st) != 0 || (uint64_t)st.st_ino != ns)
        return 0;
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "re");
    int yes = 0;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "NSpid:", 6) == 0) {
            char *last = strrchr(line, '\t');
            yes = last && atoi(last + 1) == nspid;
            break;
        }
    if (f)
        fclose(f);
    return yes;
}

/* The pid of a slot's process as the caller sees it.  The driver reports
 * pids of the caller's pid namespace (the host's, for a node daemon); a
 * process in a container registered its own, so it is looked up in the
 * caller's /proc (remembered per slot, checked at each use).  A process the
 * caller cannot see (another container's, read from inside a container with
 * its own /proc) is 0: never its own pid, which is another namespace's number
 * and could be one of the caller's.  The real driver gives the host's pid
 * there (HAMi-core #112); the simulator cannot know it from inside. */
uint64_t sim_own_pidns(void)
{
    static uint64_t own_ns; /* any thread may read it first: the same answer */
    uint64_t ns = __atomic_load_n(&own_ns, __ATOMIC_RELAXED);
    if (!ns)
        __atomic_store_n(&own_ns, ns = pidns_inode(), __ATOMIC_RELAXED);
    return ns;
}

int32_t sim_pid_for_reader(int slot)
{
    static int32_t seen[SIM_MAX_PROCS];
    const struct sim_proc *p = &sim_shm->proc[slot];
    uint64_t ns = sim_own_pidns();
    if (!p->pidns || p->pidns == ns)
        return p->pid;
    int32_t cached = __atomic_load_n(&seen[slot], __ATOMIC_RELAXED);
    if (cached > 0 && proc_is(cached, p->pidns, p->pid))
        return cached;
    DIR *d = opendir("/proc");
    int32_t found = 0;
    for (struct dirent *e; d && !found && (e = readdir(d));) {
        int pid = atoi(e->d_name);
        if (pid > 0 && proc_is(pid, p->pidns, p->pid))
            found = pid;
    }
    if (d)
        closedir(d);
    __atomic_store_n(&seen[slot], found, __ATOMIC_RELAXED);
    return found;
}

int sim_register_self(void)
{
    if (self_slot >= 0 && self_pid == getpid())
        return self_slot;
    sim_sweep_dead();
    lock_robust(&sim_shm->lock, NULL, 0);
    int got = -1;
    for (int i = 0; i < SIM_MAX_PROCS && got < 0; i++) {
        if (__atomic_load_n(&sim_shm->proc[i].live, __ATOMIC_ACQUIRE))
            continue;
        struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = i, .l_len = 1};
        if (fcntl(lock_fd, F_OFD_SETLK, &fl) != 0)
            continue; /* a process still holds it */
        struct sim_proc *p = &sim_shm->proc[i];
        memset(p, 0, sizeof *p);
        p->pid = (int32_t)getpid();
        p->pidns = pidns_inode();
        sim_own_cgroup(p->cgroup, sizeof p->cgroup);
        FILE *f = fopen("/proc/self/comm", "r");
        if (f) {
            if (fgets(p->comm, sizeof p->comm, f))
                p->comm[strcspn(p->comm, "\n")] = 0;
            fclose(f);
        }
        __atomic_store_n(&p->live, 1, __ATOMIC_RELEASE);
        got = i;
    }
    pthread_mutex_unlock(&sim_shm->lock);
    if (got >= 0) {
        self_slot = got;
        self_pid = getpid();
    }
    return got;
}

int sim_self_slot(void)
{
    return self_pid == getpid() ? self_slot : -1;
}

int sim_mem_charge(int g, uint64_t bytes)
{
    int slot = sim_register_self();
    if (slot < 0)
        return -1;
    for (int attempt = 0; attempt < 2; attempt++) {
        sim_gpu_lock(g);
        struct sim_gpu_shared *gs = &sim_shm->gpu[g];
        uint64_t cap = sim_shm->machine.gpu[g].memory;
        /* the GPU's capacity, then the cgroup's driver-enforced limit */
        if (bytes <= cap && gs->used <= cap - bytes && sim_cg_charge(g, sim_shm->proc[slot].cgroup, bytes) == 0) {
            gs->used += bytes;
            struct sim_proc *p = &sim_shm->proc[slot];
            p->mem[g] += bytes;
            if (p->mem[g] > p->max_mem[g])
                p->max_mem[g] = p->mem[g];
            sim_gpu_unlock(g);
            return 0;
        }
        sim_gpu_unlock(g);
        sim_sweep_dead(); /* a dead process may still hold what we need */
    }
    return -1;
}

void sim_mem_uncharge(int g, uint64_t bytes)
{
    int slot = sim_self_slot();
    if (slot < 0)
        return;
    sim_gpu_lock(g);
    struct sim_proc *p = &sim_shm->proc[slot];
    if (bytes > p->mem[g])
        bytes = p->mem[g]; /* never underflow */
    p->mem[g] -= bytes;
    sim_shm->gpu[g].used -= bytes;
    sim_cg_uncharge(g, p->cgroup, bytes);
    sim_gpu_unlock(g);
}

void sim_context_count(int g, int delta)
{
    int slot = sim_register_self();
    if (slot < 0)
        return;
    sim_gpu_lock(g);
    uint32_t *c = &sim_shm->proc[slot].contexts[g];
    if (delta < 0 && *c == 0)
        delta = 0;
    *c = (uint32_t)((int)*c + delta);
    if (delta > 0)
        sim_acct_record_start(g, slot);
    sim_gpu_unlock(g);
}

uint64_t sim_busy_between(int g, int slot, uint64_t from, uint64_t to)
{
    uint64_t sum = 0;
    if (to <= from)
        return 0;
    uint64_t b0 = from / SIM_BUCKET_NS, b1 = (to + SIM_BUCKET_NS - 1) / SIM_BUCKET_NS;
    if (b1 - b0 > SIM_NBUCKETS - 8)
        b0 = b1 - (SIM_NBUCKETS - 8);
    sim_gpu_lock(g);
    sim_gpu_advance(g, sim_now_ns()); /* what ran until now is in the buckets */
    for (int i = 0; i < SIM_MAX_PROCS; i++) {
        if ((slot >= 0 && i != slot) || !__atomic_load_n(&sim_shm->proc[i].live, __ATOMIC_ACQUIRE))
            continue;
        for (uint64_t b = b0; b < b1; b++) {
            struct sim_bucket *k = &sim_shm->proc[i].util[g][b % SIM_NBUCKETS];
            if (k->epoch == b)
                sum += k->busy_ns;
        }
    }
    sim_gpu_unlock(g);
    return sum;
}

void sim_reset_after_fork(void)
{
    /* The inherited fd shares the parent's open file description and with it
     * the parent's OFD lock: the child must not keep the parent's slot alive,
     * nor lock its own slot through the parent's description.  Closing our
     * copy leaves the parent's lock alone; a fresh open gives the child its
     * own description.  open/close are async-signal-safe. */
    self_slot = -1;
    if (lock_fd >= 0) {
        close(lock_fd);
        lock_fd = open(lock_path, O_RDWR | O_CLOEXEC);
    }
}

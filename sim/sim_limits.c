/* Driver-enforced memory limits per cgroup, as recent drivers offer through
 * nvmlDeviceSetMemoryLimits_v1: every allocation of a process in a limited
 * cgroup counts against it, whatever library the process called. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "sim_state.h"

void sim_own_cgroup(char *out, size_t len)
{
    /* the unified hierarchy when present, else the systemd one */
    char line[512], fallback[SIM_CG_PATH] = "";
    out[0] = 0;
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f)
        return;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (strncmp(line, "0::", 3) == 0)
            snprintf(out, len, "%s", line + 3);
        else if (strstr(line, ":name=systemd:"))
            snprintf(fallback, sizeof fallback, "%s", strstr(line, ":name=systemd:") + 14);
    }
    fclose(f);
    if (!out[0])
        snprintf(out, len, "%s", fallback);
}

/* ns is a sysfs path (/sys/fs/cgroup/.../X); cgroup is /.../X: the same
 * cgroup when ns ends with it.  The root cgroup never matches. */
int sim_cg_match(const char *ns, const char *cgroup)
{
    size_t a = strlen(ns), b = strlen(cgroup);
    if (b < 2 || a < b)
        return 0;
    return strcmp(ns + a - b, cgroup) == 0;
}

struct sim_cg_limit *sim_cg_limit_of(int g, const char *cgroup)
{
    if (!sim_shm->machine.gpu[g].memory_limits)
        return NULL;
    struct sim_cg_limit *l = sim_shm->gpu[g].limits;
    for (int i = 0; i < SIM_MAX_CG_LIMITS; i++)
        if (l[i].active && sim_cg_match(l[i].ns, cgroup))
            return &l[i];
    return NULL;
}

int sim_cg_charge(int g, const char *cgroup, uint64_t bytes)
{
    struct sim_cg_limit *l = sim_cg_limit_of(g, cgroup);
    if (!l)
        return 0;
    if (bytes > l->hard || l->used > l->hard - bytes)
        return -1;
    l->used += bytes;
    return 0;
}

void sim_cg_uncharge(int g, const char *cgroup, uint64_t bytes)
{
    struct sim_cg_limit *l = sim_cg_limit_of(g, cgroup);
    if (l)
        l->used -= bytes > l->used ? l->used : bytes;
}

/* Only NVML's limit calls check this: they run where the cgroup paths mean
 * something (the host), unlike a process inside a container, whose /sys is
 * its own. */
void sim_cg_drop_removed(int g)
{
    struct sim_cg_limit *l = sim_shm->gpu[g].limits;
    struct stat st;
    for (int i = 0; i < SIM_MAX_CG_LIMITS; i++)
        if (l[i].active && stat(l[i].ns, &st) != 0)
            l[i].active = 0; /* removing the cgroup clears its limit */
}

/* gpuslice-cuda-load: a saturating GPU workload for the simulator, to measure
 * compute shares.  It loads libcuda.so.1 the way applications do (so the
 * interposer's launch gate applies), launches kernels of the given lengths
 * back to back for SECONDS, and every 100 ms prints the GPU time its work has
 * occupied so far, exact from the simulator's accounting.
 *
 * usage: gpuslice-cuda-load SECONDS MIX [GRAPH_NODES [DUTY[@UNTIL]]]
 *   MIX          lengths in microseconds, each with an optional repeat count,
 *                cycled: "100", or "10000x1,10x1000" (one 10 ms kernel, then
 *                a thousand 10 us ones); a length ending in "h" runs at half
 *                occupancy (dynamic shared memory lets one block on an SM, not
 *                two: as long, with half the threads); "MIX@SECONDS:MIX2" runs
 *                MIX for SECONDS, then MIX2 (a load whose kernels change)
 *   GRAPH_NODES  launch each length as a CUDA graph of this many kernels, built
 *                with cuGraphAddKernelNode ("4") or by stream capture ("c4");
 *                "0": plain launches
 *   DUTY         a light load: launch only this fraction of the GPU's time
 *                ("0.1"), for the first UNTIL seconds ("0.1@8") and then as
 *                fast as the launch gate lets it
 * A pipe on stdin ends the load early when it closes (checked every 100 ms): a
 * caller that has measured what it wanted need not wait out SECONDS.
 * out: JSON lines {"t": NS, "busy": NS} (CLOCK_MONOTONIC, 100 ms apart), then
 *      {"done": true, "launches": N} */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpuslice_constants.h"

#include "gpuslice_cuda.h"

#define REPORT_NS 100000000ull
#define BUCKET_NS 10000000ull /* the simulator's accounting granularity */
#define MAX_KINDS 8
#define THREADS 1024          /* 2 blocks per SM: a wave is 2 x SMs blocks */

static const char PTX[] = ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry spin()\n{\n ret;\n}\n";

/* Whether stdin is a pipe whose writer closed it (a pipe only: a terminal or
 * /dev/null never ends the load). */
static int stdin_closed(int piped)
{
    struct pollfd p = {0, POLLIN, 0};
    char c;
    return piped && poll(&p, 1, 0) == 1 && (p.revents & POLLHUP || (p.revents & POLLIN && read(0, &c, 1) == 0));
}

static void *cuda;
#define CU(name, ...) ((CUresult(*)())dlsym(cuda, #name))(__VA_ARGS__)

static unsigned long long (*busy_ns)(int, unsigned long long, unsigned long long);

static unsigned long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

static void sleep_until(unsigned long long t)
{
    struct timespec ts = {(time_t)(t / 1000000000ull), (long)(t % 1000000000ull)};
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
}

static int fail(const char *what, CUresult r)
{
    printf("{\"error\": \"%s: %d\"}\n", what, (int)r);
    return 1;
}

/* The simulator's accounting: in the library loaded, or the real one behind
 * the interposer (GPUSLICE_REAL_LIBCUDA, or where CDI mounts it). */
static int find_accounting(void)
{
    busy_ns = (unsigned long long (*)(int, unsigned long long, unsigned long long))dlsym(cuda, "gpusliceSimBusyNs");
    const char *real = getenv(GS_ENV_REAL_LIBCUDA);
    if (!busy_ns) {
        void *h = dlopen(real && *real ? real : "/usr/lib/gpuslice/driver/libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (h)
            busy_ns = (unsigned long long (*)(int, unsigned long long, unsigned long long))dlsym(h, "gpusliceSimBusyNs");
    }
    return busy_ns ? 0 : -1;
}

struct kind {
    unsigned long long us, count;
    int half; /* one block per SM (shared memory), not two */
    unsigned grid;
    CUgraphExec exec;
};

/* MIX's entries into kinds; their number, or -1 (said why). */
static int parse_mix(char *mix, struct kind *kinds)
{
    int nk = 0;
    char *save = NULL;
    for (char *tok = strtok_r(mix, ",", &save); tok && nk < MAX_KINDS; tok = strtok_r(NULL, ",", &save)) {
        char *end, *x = strchr(tok, 'x');
        kinds[nk] = (struct kind){strtoull(tok, &end, 10), x ? strtoull(x + 1, NULL, 10) : 1, *end == 'h', 0, NULL};
        if (!kinds[nk].us || !kinds[nk].count || (*end && *end != 'h' && *end != 'x')) {
            fprintf(stderr, "gpuslice-cuda-load: bad MIX entry '%s': want MICROSECONDS[h][xCOUNT]\n", tok);
            return -1;
        }
        nk++;
    }
    return nk;
}

/* How kinds are launched: the kernel, the simulator's wave time, blocks per wave at full and
 * half occupancy, the shared memory of half, and as graphs of how many nodes. */
struct launcher {
    CUfunction fn;
    unsigned long long wave;
    unsigned per_wave, half_wave, half_shared, graph_nodes;
    int captured;
};

static unsigned kind_shared(const struct launcher *l, const struct kind *k)
{
    return k->half ? l->half_shared : 0;
}

/* A kind's grid (as many waves as its length), and its graph where launched as one. */
static CUresult prepare(const struct launcher *l, struct kind *k, const char **what)
{
    unsigned long long waves = (k->us * 1000ull + l->wave / 2) / l->wave;
    unsigned shared = kind_shared(l, k);
    CUresult r;
    k->grid = (unsigned)((waves ? waves : 1) * (k->half ? l->half_wave : l->per_wave));
    if (!l->graph_nodes)
        return CUDA_SUCCESS;
    CUgraph g;
    CUgraphNode node;
    CUstream cs;
    CUDA_KERNEL_NODE_PARAMS_v1 p = {l->fn, k->grid, 1, 1, THREADS, 1, 1, shared, NULL, NULL};
    if (l->captured) { /* the launches are recorded, not run: they cost nothing until the graph runs */
        *what = "stream capture";
        if ((r = CU(cuStreamCreate, &cs, 1u)) || (r = CU(cuStreamBeginCapture_v2, cs, 0)))
            return r;
        for (unsigned n = 0; n < l->graph_nodes; n++)
            if ((r = CU(cuLaunchKernel, l->fn, k->grid, 1, 1, THREADS, 1, 1, shared, cs, NULL, NULL)))
                return r;
        if ((r = CU(cuStreamEndCapture, cs, &g)))
            return r;
    } else {
        *what = "cuGraphAddKernelNode";
        if ((r = CU(cuGraphCreate, &g, 0)))
            return r;
        for (unsigned n = 0; n < l->graph_nodes; n++)
            if ((r = CU(cuGraphAddKernelNode, &node, g, NULL, (size_t)0, &p)))
                return r;
    }
    *what = "cuGraphInstantiateWithFlags";
    return CU(cuGraphInstantiateWithFlags, &k->exec, g, 0ull);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: gpuslice-cuda-load SECONDS MIX [GRAPH_NODES [DUTY[@UNTIL]]]\n");
        return 2;
    }
    double seconds = atof(argv[1]);
    int captured = argc > 3 && argv[3][0] == 'c';
    unsigned graph_nodes = argc > 3 ? (unsigned)atoi(argv[3] + captured) : 0;
    double duty = argc > 4 ? atof(argv[4]) : 0, duty_for = 0;
    const char *at = argc > 4 ? strchr(argv[4], '@') : NULL;
    if (at)
        duty_for = atof(at + 1);
    if (argc > 4 && (duty <= 0 || duty >= 1 || (at && duty_for <= 0))) {
        fprintf(stderr, "gpuslice-cuda-load: bad DUTY '%s': want a fraction between 0 and 1, optionally @SECONDS\n",
                argv[4]);
        return 2;
    }
    struct kind sets[2][MAX_KINDS];
    int counts[2] = {0, 0};
    double switch_after = 0; /* seconds of the first MIX, where a second follows */
    char *second = strchr(argv[2], '@');
    if (second) {
        *second++ = 0;
        switch_after = strtod(second, &second);
        if (switch_after <= 0 || *second != ':') {
            fprintf(stderr, "gpuslice-cuda-load: bad MIX: want MIX@SECONDS:MIX2 with SECONDS above 0\n");
            return 2;
        }
        second++;
    }
    if ((counts[0] = parse_mix(argv[2], sets[0])) <= 0 || (second && (counts[1] = parse_mix(second, sets[1])) <= 0))
        return 2;
    const char *lib = getenv("GPUSLICE_PROBE_LIBCUDA");
    cuda = dlopen(lib && *lib ? lib : "libcuda.so.1", RTLD_NOW);
    if (!cuda || find_accounting() != 0) {
        printf("{\"error\": \"%s\"}\n", cuda ? "no simulator accounting (gpusliceSimBusyNs)" : dlerror());
        return 2;
    }
    CUresult r;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    int sms = 0;
    if ((r = CU(cuInit, 0)) || (r = CU(cuDeviceGet, &dev, 0)) || (r = CU(cuDevicePrimaryCtxRetain, &ctx, dev)) ||
        (r = CU(cuCtxSetCurrent, ctx)) || (r = CU(cuModuleLoadData, &mod, PTX)) ||
        (r = CU(cuModuleGetFunction, &fn, mod, "spin")) ||
        (r = CU(cuDeviceGetAttribute, &sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)))
        return fail("setup", r);
    unsigned per_wave = 2u * (unsigned)sms;

    /* One wave alone, measured: the simulator's wave time. */
    unsigned long long b = (now_ns() / BUCKET_NS + 1) * BUCKET_NS;
    sleep_until(b);
    if ((r = CU(cuLaunchKernel, fn, per_wave, 1, 1, THREADS, 1, 1, 0, NULL, NULL, NULL)) ||
        (r = CU(cuCtxSynchronize)))
        return fail("calibration", r);
    unsigned long long end = (now_ns() / BUCKET_NS + 1) * BUCKET_NS;
    sleep_until(end);
    unsigned long long wave = busy_ns(0, b, end);
    if (!wave)
        return fail("calibration measured nothing", 0);
    printf("{\"wave_ns\": %llu, \"sms\": %d}\n", wave, sms);

    /* half occupancy: shared memory for a little over half an SM, so one block fits where two did */
    int shared_per_sm = 0, half_fit = 0;
    if ((r = CU(cuDeviceGetAttribute, &shared_per_sm, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, dev)))
        return fail("shared memory per SM", r);
    struct launcher l = {fn, wave, per_wave, 0, (unsigned)shared_per_sm / 2u, graph_nodes, captured};
    if ((r = CU(cuFuncSetAttribute, fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)l.half_shared)) ||
        (r = CU(cuOccupancyMaxActiveBlocksPerMultiprocessor, &half_fit, fn, THREADS, (size_t)l.half_shared)))
        return fail("half occupancy", r);
    l.half_wave = (unsigned)half_fit * (unsigned)sms;
    const char *what = NULL;
    for (int set = 0; set < 2; set++)
        for (int i = 0; i < counts[set]; i++)
            if ((r = prepare(&l, &sets[set][i], &what)))
                return fail(what, r);

    struct stat in;
    int piped = fstat(0, &in) == 0 && S_ISFIFO(in.st_mode);
    unsigned long long start = now_ns(), stop = start + (unsigned long long)(seconds * 1e9);
    unsigned long long reported = start / REPORT_NS * REPORT_NS, total = 0, launches = 0;
    unsigned long long light_until = duty > 0 ? (duty_for > 0 ? start + (unsigned long long)(duty_for * 1e9) : stop) : 0;
    unsigned long long next_launch = start;
    printf("{\"t\": %llu, \"busy\": 0}\n", reported);
    fflush(stdout);
    unsigned long long switch_at = counts[1] ? start + (unsigned long long)(switch_after * 1e9) : stop;
    struct kind *kinds = sets[0];
    int nk = counts[0];
    for (int i = 0;; i = (i + 1) % nk) {
        for (unsigned long long c = 0; c < kinds[i].count; c++) {
            unsigned long long now = now_ns();
            if (now >= stop)
                goto done;
            if (now >= switch_at && kinds == sets[0]) { /* the load's kernels change */
                kinds = sets[1], nk = counts[1], i = 0, c = 0;
                printf("{\"switched\": %llu}\n", now);
            }
            /* a 100 ms period is final once its last bucket is past */
            while (now >= reported + REPORT_NS + BUCKET_NS) {
                total += busy_ns(0, reported, reported + REPORT_NS);
                reported += REPORT_NS;
                printf("{\"t\": %llu, \"busy\": %llu}\n", reported, total);
                fflush(stdout);
                if (stdin_closed(piped))
                    goto done;
            }
            if (now < light_until) { /* a light load: this launch's GPU time, spread out */
                if (next_launch + REPORT_NS < now)
                    next_launch = now; /* held back (by the gate or the queue): no catching up */
                sleep_until(next_launch);
                next_launch += (unsigned long long)(kinds[i].us * 1000.0 * (graph_nodes ? graph_nodes : 1) / duty);
            }
            r = kinds[i].exec ? CU(cuGraphLaunch, kinds[i].exec, NULL)
                              : CU(cuLaunchKernel, fn, kinds[i].grid, 1, 1, THREADS, 1, 1, kind_shared(&l, &kinds[i]),
                                   NULL, NULL, NULL);
            if (r)
                return fail("launch", r);
            launches++;
        }
    }
done:
    printf("{\"done\": true, \"launches\": %llu}\n", launches);
    return 0;
}

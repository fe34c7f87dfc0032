/* gpuslice-cuda-load: a saturating GPU workload for the simulator, to measure
 * compute shares.  It loads libcuda.so.1 the way applications do (so the
 * interposer's launch gate applies), launches kernels of the given lengths
 * back to back for SECONDS, and every 100 ms prints the GPU time its work has
 * occupied so far, exact from the simulator's accounting.
 *
 * usage: gpuslice-cuda-load SECONDS MIX [GRAPH_NODES [DUTY[@UNTIL]]]
 *   MIX          lengths in microseconds, each with an optional repeat count,
 *                cycled: "100", or "10000x1,10x1000" (one 10 ms kernel, then
 *                a thousand 10 us ones)
 *   GRAPH_NODES  launch each length as a CUDA graph of this many kernels, built
 *                with cuGraphAddKernelNode ("4") or by stream capture ("c4");
 *                "0": plain launches
 *   DUTY         a light load: launch only this fraction of the GPU's time
 *                ("0.1"), for the first UNTIL seconds ("0.1@8") and then as
 *                fast as the launch gate lets it
 * out: JSON lines {"t": NS, "busy": NS} (CLOCK_MONOTONIC, 100 ms apart), then
 *      {"done": true, "launches": N} */
#define _GNU_SOURCE
#include <dlfcn.h>
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
    unsigned grid;
    CUgraphExec exec;
};

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
    struct kind kinds[MAX_KINDS];
    int nk = 0;
    for (char *tok = strtok(argv[2], ","); tok && nk < MAX_KINDS; tok = strtok(NULL, ",")) {
        char *x = strchr(tok, 'x');
        kinds[nk] = (struct kind){strtoull(tok, NULL, 10), x ? strtoull(x + 1, NULL, 10) : 1, 0, NULL};
        if (!kinds[nk].us || !kinds[nk].count) {
            fprintf(stderr, "gpuslice-cuda-load: bad MIX entry '%s': want MICROSECONDS[xCOUNT]\n", tok);
            return 2;
        }
        nk++;
    }
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

    for (int i = 0; i < nk; i++) {
        unsigned long long waves = (kinds[i].us * 1000ull + wave / 2) / wave;
        kinds[i].grid = (unsigned)((waves ? waves : 1) * per_wave);
        if (graph_nodes) {
            CUgraph g;
            CUgraphNode node;
            CUstream cs;
            CUDA_KERNEL_NODE_PARAMS_v1 p = {fn, kinds[i].grid, 1, 1, THREADS, 1, 1, 0, NULL, NULL};
            if (captured) { /* the launches are recorded, not run: they cost nothing until the graph runs */
                if ((r = CU(cuStreamCreate, &cs, 1u)) || (r = CU(cuStreamBeginCapture_v2, cs, 0)))
                    return fail("cuStreamBeginCapture", r);
                for (unsigned n = 0; n < graph_nodes; n++)
                    if ((r = CU(cuLaunchKernel, fn, kinds[i].grid, 1, 1, THREADS, 1, 1, 0, cs, NULL, NULL)))
                        return fail("captured cuLaunchKernel", r);
                if ((r = CU(cuStreamEndCapture, cs, &g)))
                    return fail("cuStreamEndCapture", r);
            } else {
                if ((r = CU(cuGraphCreate, &g, 0)))
                    return fail("cuGraphCreate", r);
                for (unsigned n = 0; n < graph_nodes; n++)
                    if ((r = CU(cuGraphAddKernelNode, &node, g, NULL, (size_t)0, &p)))
                        return fail("cuGraphAddKernelNode", r);
            }
            if ((r = CU(cuGraphInstantiateWithFlags, &kinds[i].exec, g, 0ull)))
                return fail("cuGraphInstantiateWithFlags", r);
        }
    }

    unsigned long long start = now_ns(), stop = start + (unsigned long long)(seconds * 1e9);
    unsigned long long reported = start / REPORT_NS * REPORT_NS, total = 0, launches = 0;
    unsigned long long light_until = duty > 0 ? (duty_for > 0 ? start + (unsigned long long)(duty_for * 1e9) : stop) : 0;
    unsigned long long next_launch = start;
    printf("{\"t\": %llu, \"busy\": 0}\n", reported);
    fflush(stdout);
    for (int i = 0;; i = (i + 1) % nk) {
        for (unsigned long long c = 0; c < kinds[i].count; c++) {
            unsigned long long now = now_ns();
            if (now >= stop)
                goto done;
            /* a 100 ms period is final once its last bucket is past */
            while (now >= reported + REPORT_NS + BUCKET_NS) {
                total += busy_ns(0, reported, reported + REPORT_NS);
                reported += REPORT_NS;
                printf("{\"t\": %llu, \"busy\": %llu}\n", reported, total);
                fflush(stdout);
            }
            if (now < light_until) { /* a light load: this launch's GPU time, spread out */
                if (next_launch + REPORT_NS < now)
                    next_launch = now; /* held back (by the gate or the queue): no catching up */
                sleep_until(next_launch);
                next_launch += (unsigned long long)(kinds[i].us * 1000.0 * (graph_nodes ? graph_nodes : 1) / duty);
            }
            r = kinds[i].exec ? CU(cuGraphLaunch, kinds[i].exec, NULL)
                              : CU(cuLaunchKernel, fn, kinds[i].grid, 1, 1, THREADS, 1, 1, 0, NULL, NULL, NULL);
            if (r)
                return fail("launch", r);
            launches++;
        }
    }
done:
    printf("{\"done\": true, \"launches\": %llu}\n", launches);
    return 0;
}

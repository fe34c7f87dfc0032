/* Reads the simulated machine from YAML or JSON (JSON is valid YAML, so one
 * libyaml document loader covers both).  Every error names the key path. */
#define _GNU_SOURCE
#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "sim_state.h"

struct cfg {
    yaml_document_t doc;
    const char *path;
    char *err;
    size_t errlen;
};

static int fail(struct cfg *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(struct cfg *c, const char *fmt, ...)
{
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(c->err, c->errlen, "sim config %s: %s", c->path, msg);
    return -1;
}

static const char *scalar(yaml_node_t *n)
{
    return (n && n->type == YAML_SCALAR_NODE) ? (const char *)n->data.scalar.value : NULL;
}

/* "16Gi", "1500Mi", "17179869184", "16GiB" -> bytes.  Returns -1 if bad. */
static int parse_size(const char *s, uint64_t *out)
{
    if (!s || !isdigit((unsigned char)*s))
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return -1;
    static const struct { const char *sfx; unsigned shift; } units[] = {
        {"", 0}, {"B", 0}, {"Ki", 10}, {"KiB", 10}, {"Mi", 20}, {"MiB", 20},
        {"Gi", 30}, {"GiB", 30}, {"Ti", 40}, {"TiB", 40}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].sfx) == 0) {
            if (units[i].shift && v > (UINT64_MAX >> units[i].shift))
                return -1;
            *out = (uint64_t)v << units[i].shift;
            return 0;
        }
    }
    return -1;
}

/* "10us", "2ms", "5000" (ns) -> ns */
static int parse_duration(const char *s, uint64_t *out)
{
    if (!s || !isdigit((unsigned char)*s))
        return -1;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    uint64_t mul = strcmp(end, "") == 0 || strcmp(end, "ns") == 0 ? 1
                   : strcmp(end, "us") == 0                      ? 1000
                   : strcmp(end, "ms") == 0                      ? 1000000
                                                                 : 0;
    if (!mul || v == 0)
        return -1;
    *out = v * mul;
    return 0;
}

static int parse_int(const char *s, long lo, long hi, long *out)
{
    if (!s || !*s)
        return -1;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int parse_uuid(const char *s, unsigned char bytes[16])
{
    if (strncmp(s, "GPU-", 4) != 0 || strlen(s) != 40)
        return -1;
    static const int dash[] = {8, 13, 18, 23};
    const char *p = s + 4;
    int nb = 0;
    for (int i = 0; i < 36; i++) {
        int is_dash = 0;
        for (int d = 0; d < 4; d++)
            is_dash |= (i == dash[d]);
        if (is_dash) {
            if (p[i] != '-')
                return -1;
            continue;
        }
        if (!isxdigit((unsigned char)p[i]) || !isxdigit((unsigned char)p[i + 1]))
            return -1;
        char hex[3] = {p[i], p[i + 1], 0};
        bytes[nb++] = (unsigned char)strtoul(hex, NULL, 16);
        i++;
    }
    return nb == 16 ? 0 : -1;
}

static int parse_pcie(const char *s)
{
    static const struct { const char *k; int v; } lv[] = {
        {"internal", SIM_TOPO_INTERNAL}, {"single", SIM_TOPO_SINGLE}, {"pix", SIM_TOPO_SINGLE},
        {"multiple", SIM_TOPO_MULTIPLE}, {"pxb", SIM_TOPO_MULTIPLE},
        {"hostbridge", SIM_TOPO_HOSTBRIDGE}, {"phb", SIM_TOPO_HOSTBRIDGE},
        {"node", SIM_TOPO_NODE}, {"system", SIM_TOPO_SYSTEM}, {"sys", SIM_TOPO_SYSTEM}};
    for (size_t i = 0; s && i < sizeof lv / sizeof lv[0]; i++)
        if (strcasecmp(s, lv[i].k) == 0)
            return lv[i].v;
    return -1;
}

static int gpu_from_node(struct cfg *c, yaml_node_t *n, int idx, struct sim_gpu_info *g)
{
    if (n->type != YAML_MAPPING_NODE)
        return fail(c, "gpus[%d]: must be a mapping", idx);
    int have_memory = 0, have_uuid = 0, have_pci = 0;
    snprintf(g->name, sizeof g->name, "gpuslice Simulated GPU");
    g->sms = 108;
    g->cc_major = 8;
    g->cc_minor = 0;
    g->wave_ns = 10000;
    /* what an H100 with driver 580 answered (tests/data/real-gpu/h100-2026-11-26): each 200 ms
     * period, the GPU's use to the process that ran most in it, none for a period that rounds
     * to 0 %; util_stamps: ideal is the driver no GPU is (one exact sample per process for all
     * since the caller's last), for tests of the controller's arithmetic */
    g->util_sample_ns = 20 * SIM_BUCKET_NS;
    g->util_stamps = SIM_STAMPS_BUSIEST;
    int ideal = 0, have_sample_time = 0;
    g->timeslice_ns = 2000000;
    g->clock_khz = 1410000;
    g->memory_limits = 1;
    g->util_zero_samples = 0;
    g->power_limit_mw = 400000; /* A100 SXM4 */
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        const char *k = scalar(yaml_document_get_node(&c->doc, p->key));
        const char *v = scalar(yaml_document_get_node(&c->doc, p->value));
        if (!k)
            return fail(c, "gpus[%d]: keys must be strings", idx);
        if (!v)
            return fail(c, "gpus[%d].%s: must be a single value", idx, k);
        long iv;
        if (strcmp(k, "name") == 0) {
            if (strlen(v) >= sizeof g->name || !*v)
                return fail(c, "gpus[%d].name: must be 1 to 95 characters", idx);
            snprintf(g->name, sizeof g->name, "%s", v);
        } else if (strcmp(k, "uuid") == 0) {
            if (parse_uuid(v, g->uuid_bytes))
                return fail(c, "gpus[%d].uuid: must look like GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (hex), got \"%s\"", idx, v);
            snprintf(g->uuid, sizeof g->uuid, "%s", v);
            have_uuid = 1;
        } else if (strcmp(k, "pci_bus_id") == 0) {
            unsigned dom, bus, dev, fn;
            char extra;
            if (sscanf(v, "%8x:%2x:%2x.%1x%c", &dom, &bus, &dev, &fn, &extra) != 4)
                return fail(c, "gpus[%d].pci_bus_id: must look like 00000000:07:00.0, got \"%s\"", idx, v);
            g->pci_domain = dom, g->pci_bus = bus, g->pci_device = dev, g->pci_function = fn;
            have_pci = 1;
        } else if (strcmp(k, "memory") == 0) {
            if (parse_size(v, &g->memory) || g->memory == 0)
                return fail(c, "gpus[%d].memory: must be a positive size such as 16Gi, 1500Mi or bytes, got \"%s\"", idx, v);
            have_memory = 1;
        } else if (strcmp(k, "context_memory") == 0) {
            if (parse_size(v, &g->context_memory))
                return fail(c, "gpus[%d].context_memory: must be a size such as 300Mi or 0, got \"%s\"", idx, v);
        } else if (strcmp(k, "module_memory") == 0) {
            if (parse_size(v, &g->module_memory))
                return fail(c, "gpus[%d].module_memory: must be a size such as 2Mi or 0, got \"%s\"", idx, v);
        } else if (strcmp(k, "local_memory") == 0) {
            if (strcmp(v, "true") != 0 && strcmp(v, "false") != 0)
                return fail(c, "gpus[%d].local_memory: must be true or false, got \"%s\"", idx, v);
            g->local_memory = strcmp(v, "true") == 0;
        } else if (strcmp(k, "sms") == 0) {
            if (parse_int(v, 1, 1024, &iv))
                return fail(c, "gpus[%d].sms: must be an integer from 1 to 1024, got \"%s\"", idx, v);
            g->sms = (int)iv;
        } else if (strcmp(k, "compute_capability") == 0) {
            int maj, min;
            char extra;
            if (sscanf(v, "%d.%d%c", &maj, &min, &extra) != 2 || maj < 1 || maj > 20 || min < 0 || min > 9)
                return fail(c, "gpus[%d].compute_capability: must look like 8.0, got \"%s\"", idx, v);
            g->cc_major = maj, g->cc_minor = min;
        } else if (strcmp(k, "wave_time") == 0) {
            if (parse_duration(v, &g->wave_ns))
                return fail(c, "gpus[%d].wave_time: must be a positive duration such as 10us, 2ms or ns, got \"%s\"", idx, v);
        } else if (strcmp(k, "util_sample_time") == 0) {
            uint64_t ns;
            if (parse_duration(v, &ns) || ns % SIM_BUCKET_NS || ns > 100 * SIM_BUCKET_NS)
                return fail(c, "gpus[%d].util_sample_time: must be a multiple of 10ms up to 1000ms, got \"%s\"", idx, v);
            g->util_sample_ns = ns;
            have_sample_time = 1;
        } else if (strcmp(k, "timeslice") == 0) {
            uint64_t ns;
            if (parse_duration(v, &ns) || ns < 100000 || ns > 1000000000)
                return fail(c, "gpus[%d].timeslice: must be a duration from 100us to 1s such as 2ms, got \"%s\"", idx, v);
            g->timeslice_ns = ns;
        } else if (strcmp(k, "util_stamps") == 0) {
            if (strcmp(v, "busiest") == 0)
                g->util_stamps = SIM_STAMPS_BUSIEST;
            else if (strcmp(v, "per_process") == 0)
                g->util_stamps = SIM_STAMPS_PER_PROCESS;
            else if (strcmp(v, "together") == 0)
                g->util_stamps = SIM_STAMPS_TOGETHER;
            else if (strcmp(v, "ideal") == 0)
                ideal = 1;
            else
                return fail(c, "gpus[%d].util_stamps: must be busiest (one sample per period, the GPU's use, to the process that ran most: H100, driver 580), per_process (each process on its own clock), together or ideal (one exact sample per process since the caller's last), got \"%s\"", idx, v);
        } else if (strcmp(k, "util_zero_samples") == 0) {
            if (strcmp(v, "true") && strcmp(v, "false"))
                return fail(c, "gpus[%d].util_zero_samples: must be true or false (a sample for a period whose use rounds to 0 %%), got \"%s\"", idx, v);
            g->util_zero_samples = strcmp(v, "true") == 0;
        } else if (strcmp(k, "memory_limits") == 0) {
            if (strcmp(v, "true") && strcmp(v, "false"))
                return fail(c, "gpus[%d].memory_limits: must be true or false (driver-enforced cgroup limits), got \"%s\"", idx, v);
            g->memory_limits = strcmp(v, "true") == 0;
        } else if (strcmp(k, "clock_mhz") == 0) {
            if (parse_int(v, 1, 10000, &iv))
                return fail(c, "gpus[%d].clock_mhz: must be an integer from 1 to 10000, got \"%s\"", idx, v);
            g->clock_khz = (int)iv * 1000;
        } else if (strcmp(k, "power_limit_w") == 0) {
            if (parse_int(v, 1, 10000, &iv))
                return fail(c, "gpus[%d].power_limit_w: must be an integer from 1 to 10000, got \"%s\"", idx, v);
            g->power_limit_mw = (unsigned)iv * 1000u;
        } else if (strcmp(k, "ecc_uncorrected") == 0) {
            if (parse_int(v, 0, 1000000000, &iv))
                return fail(c, "gpus[%d].ecc_uncorrected: must be an integer from 0 to 1000000000, got \"%s\"", idx, v);
            g->ecc_uncorrected = (unsigned long long)iv;
        } else {
            return fail(c, "gpus[%d]: unknown key \"%s\" (accepted: name, uuid, pci_bus_id, memory, context_memory, module_memory, local_memory, sms, compute_capability, wave_time, util_sample_time, util_zero_samples, util_stamps, timeslice, clock_mhz, memory_limits, power_limit_w, ecc_uncorrected)", idx, k);
        }
    }
    if (!have_memory)
        return fail(c, "gpus[%d].memory: is required (a size such as 16Gi)", idx);
    if (ideal && have_sample_time)
        return fail(c, "gpus[%d].util_sample_time: util_stamps ideal has no sample period (one sample per process covers all since the caller's last)", idx);
    if (ideal) {
        g->util_stamps = SIM_STAMPS_TOGETHER;
        g->util_sample_ns = SIM_BUCKET_NS;
        g->util_zero_samples = 1;
    }
    if (g->context_memory >= g->memory)
        return fail(c, "gpus[%d].context_memory: must be smaller than memory", idx);
    if (!have_uuid) { /* deterministic per index, so every process agrees */
        for (int i = 0; i < 16; i++)
            g->uuid_bytes[i] = (unsigned char)(0x5a ^ (i * 37) ^ (idx * 101));
        g->uuid_bytes[6] = (unsigned char)((g->uuid_bytes[6] & 0x0f) | 0x40);
    }
    const unsigned char *b = g->uuid_bytes;
    snprintf(g->uuid, sizeof g->uuid,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
    if (!have_pci)
        g->pci_bus = (unsigned)(idx + 1) * 0x10;
    snprintf(g->pci_bus_id, sizeof g->pci_bus_id, "%08X:%02X:%02X.%X", g->pci_domain, g->pci_bus,
             g->pci_device, g->pci_function);
    g->pci_device_id = 0x10de | (0x20b0u << 16);
    return 0;
}

static int topology_from_node(struct cfg *c, yaml_node_t *n, struct sim_machine *m)
{
    if (n->type != YAML_SEQUENCE_NODE)
        return fail(c, "topology: must be a list of {gpus: [a, b], pcie: LEVEL, nvlinks: N}");
    int idx = 0;
    for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top; it++, idx++) {
        yaml_node_t *e = yaml_document_get_node(&c->doc, *it);
        if (e->type != YAML_MAPPING_NODE)
            return fail(c, "topology[%d]: must be a mapping", idx);
        int a = -1, b = -1, pcie = -1;
        long links = 0;
        for (yaml_node_pair_t *p = e->data.mapping.pairs.start; p < e->data.mapping.pairs.top; p++) {
            const char *k = scalar(yaml_document_get_node(&c->doc, p->key));
            yaml_node_t *vn = yaml_document_get_node(&c->doc, p->value);
            if (k && strcmp(k, "gpus") == 0) {
                long x, y;
                if (vn->type != YAML_SEQUENCE_NODE || vn->data.sequence.items.top - vn->data.sequence.items.start != 2 ||
                    parse_int(scalar(yaml_document_get_node(&c->doc, vn->data.sequence.items.start[0])), 0, m->gpu_count - 1, &x) ||
                    parse_int(scalar(yaml_document_get_node(&c->doc, vn->data.sequence.items.start[1])), 0, m->gpu_count - 1, &y) || x == y)
                    return fail(c, "topology[%d].gpus: must be two different GPU indices below %d", idx, m->gpu_count);
                a = (int)x, b = (int)y;
            } else if (k && strcmp(k, "pcie") == 0) {
                pcie = parse_pcie(scalar(vn));
                if (pcie < 0)
                    return fail(c, "topology[%d].pcie: must be one of internal, single, multiple, hostbridge, node, system", idx);
            } else if (k && strcmp(k, "nvlinks") == 0) {
                if (parse_int(scalar(vn), 0, 36, &links))
                    return fail(c, "topology[%d].nvlinks: must be an integer from 0 to 36", idx);
            } else {
                return fail(c, "topology[%d]: unknown key \"%s\" (accepted: gpus, pcie, nvlinks)", idx, k ? k : "?");
            }
        }
        if (a < 0)
            return fail(c, "topology[%d].gpus: is required", idx);
        if (pcie >= 0)
            m->pcie[a][b] = m->pcie[b][a] = (unsigned char)pcie;
        m->nvlinks[a][b] = m->nvlinks[b][a] = (unsigned char)links;
    }
    return 0;
}

static int machine_from_doc(struct cfg *c, struct sim_machine *m)
{
    yaml_node_t *root = yaml_document_get_root_node(&c->doc);
    if (!root || root->type != YAML_MAPPING_NODE)
        return fail(c, "top level must be a mapping with a \"gpus\" list");
    m->driver_version = 13000;
    snprintf(m->driver_string, sizeof m->driver_string, "580.95.05");
    yaml_node_t *gpus = NULL, *topo = NULL;
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
        const char *k = scalar(yaml_document_get_node(&c->doc, p->key));
        yaml_node_t *vn = yaml_document_get_node(&c->doc, p->value);
        long iv;
        if (k && strcmp(k, "gpus") == 0) {
            gpus = vn;
        } else if (k && strcmp(k, "topology") == 0) {
            topo = vn;
        } else if (k && strcmp(k, "cuda_driver_version") == 0) {
            if (parse_int(scalar(vn), 2000, 13000, &iv))
                return fail(c, "cuda_driver_version: must be an integer from 2000 to 13000 (the newest API the simulator implements), got \"%s\"", scalar(vn) ? scalar(vn) : "?");
            m->driver_version = (int)iv;
        } else if (k && strcmp(k, "driver_version") == 0) {
            const char *s = scalar(vn);
            if (!s || !*s || strlen(s) >= sizeof m->driver_string)
                return fail(c, "driver_version: must be a string such as \"580.95.05\"");
            snprintf(m->driver_string, sizeof m->driver_string, "%s", s);
        } else {
            return fail(c, "unknown key \"%s\" (accepted: gpus, topology, driver_version, cuda_driver_version)", k ? k : "?");
        }
    }
    if (!gpus || gpus->type != YAML_SEQUENCE_NODE)
        return fail(c, "gpus: is required and must be a list");
    int n = (int)(gpus->data.sequence.items.top - gpus->data.sequence.items.start);
    if (n < 1 || n > SIM_MAX_GPUS)
        return fail(c, "gpus: must list 1 to %d GPUs, got %d", SIM_MAX_GPUS, n);
    m->gpu_count = n;
    for (int i = 0; i < n; i++)
        if (gpu_from_node(c, yaml_document_get_node(&c->doc, gpus->data.sequence.items.start[i]), i, &m->gpu[i]))
            return -1;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++) {
            if (strcmp(m->gpu[i].uuid, m->gpu[j].uuid) == 0)
                return fail(c, "gpus[%d].uuid: duplicate of gpus[%d].uuid (%s); every GPU needs its own UUID", i, j, m->gpu[i].uuid);
            if (strcmp(m->gpu[i].pci_bus_id, m->gpu[j].pci_bus_id) == 0)
                return fail(c, "gpus[%d].pci_bus_id: duplicate of gpus[%d].pci_bus_id (%s)", i, j, m->gpu[i].pci_bus_id);
        }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            m->pcie[i][j] = i == j ? SIM_TOPO_INTERNAL : SIM_TOPO_SYSTEM;
    return topo ? topology_from_node(c, topo, m) : 0;
}

int sim_config_load(const char *path, struct sim_machine *out, char *err, size_t errlen)
{
    struct cfg c = {.path = path, .err = err, .errlen = errlen};
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f)
        return fail(&c, "cannot open: %s (set GPUSLICE_SIM_CONFIG to a YAML or JSON file)", strerror(errno));
    yaml_parser_t parser;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_file(&parser, f);
    int rc;
    if (!yaml_parser_load(&parser, &c.doc)) {
        rc = fail(&c, "not valid YAML/JSON: %s at line %zu", parser.problem ? parser.problem : "parse error",
                  parser.problem_mark.line + 1);
        yaml_parser_delete(&parser);
        fclose(f);
        return rc;
    }
    rc = machine_from_doc(&c, out);
    yaml_document_delete(&c.doc);
    yaml_parser_delete(&parser);
    fclose(f);
    return rc;
}

/* GPUSLICE_SIM_CONFIG, else gpuslice-sim.yaml beside this library's file (a
 * library reached through a symlink looks beside the file the link leads to). */
const char *sim_config_path(void)
{
    static char path[4096];
    const char *env = getenv("GPUSLICE_SIM_CONFIG");
    if (env && *env)
        return env;
    Dl_info info;
    if (dladdr((void *)sim_config_path, &info) && info.dli_fname) {
        if (!realpath(info.dli_fname, path))
            snprintf(path, sizeof path, "%s", info.dli_fname);
        char *slash = strrchr(path, '/');
        if (slash) {
            snprintf(slash + 1, sizeof path - (size_t)(slash + 1 - path), "gpuslice-sim.yaml");
            return path;
        }
    }
    return "gpuslice-sim.yaml";
}

/* Exported for `gpuslice sim check`: the one parser, used from Python. */
SIM_API int gpusliceSimCheckConfig(const char *path, char *err, size_t errlen)
{
    struct sim_machine m;
    if (!path)
        path = sim_config_path();
    return sim_config_load(path, &m, err, errlen) ? -1 : m.gpu_count;
}

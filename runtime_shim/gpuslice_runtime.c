/* gpuslice-runtime: an OCI runtime in front of runc/crun
 * (docs/oci-integration.md).
 *
 * Every verb but `create` is handed to the real runtime unchanged: the same
 * argv, so the same exit status and logs, at the cost of one exec.  On
 * `create`, a bundle whose config.json mentions no gpuslice.io annotation and
 * no GPUSLICE_* request variable is left byte for byte as it was; otherwise the daemon, in one round trip on its
 * runtime socket, reserves the slice and writes the CDI edits of the GPUs it
 * placed, and the hook, into config.json (atomically); then the real runtime
 * runs.  A failure is one line on stderr and in the runtime's log (in its
 * format), and the real runtime never runs. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime_call.h"

/* GS_ENV_RUNTIME: the real runtime, a path or a name on PATH; GS_ENV_CDI_SPEC: the CDI spec to
 * apply (default: the daemon finds it) */
#define RUNTIME_ENV GS_ENV_RUNTIME
#define SPEC_ENV GS_ENV_CDI_SPEC
/* what a config.json that may ask for a slice mentions: an annotation, or one of
 * the environment entries that mirror them (gpuslice/request.py, ENV_NAMES) */
static const char *const MARKS[] = {
    "\"gpuslice.io/",       "\"GPUSLICE_GPUS=",           "\"GPUSLICE_MEMORY=",      "\"GPUSLICE_CORES=",
    "\"GPUSLICE_PRIORITY=", "\"GPUSLICE_COMPUTE_POLICY=", "\"GPUSLICE_DEVICE=",      "\"GPUSLICE_AVOID_DEVICE=",
    "\"GPUSLICE_DEVICE_TYPE=", "\"GPUSLICE_AVOID_DEVICE_TYPE=", "\"GPUSLICE_GPU_POLICY=",
    "\"GPUSLICE_NUMA_BIND=", NULL};

static const char *const GLOBAL_WITH_VALUE[] = {"--root", "--log", "--log-format", "--criu", "--rootless", NULL};
static const char *const CREATE_WITH_VALUE[] = {"--bundle", "-b", "--console-socket", "--pid-file", "--preserve-fds",
                                                NULL};

struct command_line {
    const char *log, *log_format; /* global options the error report needs */
    const char *command;
    const char *bundle;
    const char *id; /* the last positional */
};

static int takes_value(const char *arg, const char *const *names)
{
    size_t len = strcspn(arg, "=");
    if (arg[len] == '=')
        return 0; /* --opt=value carries its own */
    for (; *names; names++)
        if (strcmp(arg, *names) == 0)
            return 1;
    return 0;
}

/* The value of option `name` in arg (and maybe the next one), or NULL. */
static const char *option(const char *name, int argc, char **argv, int *i)
{
    size_t len = strlen(name);
    if (strncmp(argv[*i], name, len) != 0)
        return NULL;
    if (argv[*i][len] == '=')
        return argv[*i] + len + 1;
    if (argv[*i][len] == 0 && *i + 1 < argc)
        return argv[++*i];
    return NULL;
}

static void parse(int argc, char **argv, struct command_line *c)
{
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *v;
        if ((v = option("--log-format", argc, argv, &i)))
            c->log_format = v;
        else if ((v = option("--log", argc, argv, &i)))
            c->log = v;
        else if (takes_value(argv[i], GLOBAL_WITH_VALUE) && i + 1 < argc)
            i++;
    }
    if (i >= argc)
        return;
    c->command = argv[i++];
    for (; i < argc; i++) {
        const char *v;
        if (argv[i][0] == '-' && argv[i][1]) {
            if ((v = option("--bundle", argc, argv, &i)) || (v = option("-b", argc, argv, &i)))
                c->bundle = v;
            else if (takes_value(argv[i], CREATE_WITH_VALUE) && i + 1 < argc)
                i++;
        } else {
            c->id = argv[i];
        }
    }
}

/* One line on stderr, and in the runtime's log file, in its format. */
static void report(const struct command_line *c, const char *message)
{
    fprintf(stderr, "gpuslice-runtime: %s\n", message);
    if (!c->log)
        return;
    FILE *f = fopen(c->log, "a");
    if (!f)
        return;
    if (c->log_format && strcmp(c->log_format, "json") == 0) {
        char now[32];
        time_t t = time(NULL);
        strftime(now, sizeof now, "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
        fputs("{\"level\": \"error\", \"msg\": \"gpuslice-runtime: ", f);
        for (const unsigned char *p = (const unsigned char *)message; *p; p++) {
            if (*p == '"' || *p == '\\')
                fprintf(f, "\\%c", *p);
            else if (*p < 0x20)
                fprintf(f, "\\u%04x", *p);
            else
                fputc(*p, f);
        }
        fprintf(f, "\", \"time\": \"%s\"}\n", now);
    } else {
        fprintf(f, "gpuslice-runtime: %s\n", message);
    }
    fclose(f);
}

static int is_me(const char *path)
{
    char me[PATH_MAX], it[PATH_MAX];
    return realpath("/proc/self/exe", me) && realpath(path, it) && strcmp(me, it) == 0;
}

/* The real runtime's path, or NULL with the reason in why. */
static const char *real_runtime(char *buf, size_t cap, char *why, size_t why_cap)
{
    const char *wanted = getenv(RUNTIME_ENV);
    if (!wanted || !*wanted)
        wanted = "runc";
    if (strchr(wanted, '/')) {
        if (access(wanted, X_OK) == 0 && !is_me(wanted))
            return wanted;
    } else {
        const char *path = getenv("PATH");
        if (!path || !*path)
            path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
        for (const char *p = path; *p;) {
            size_t len = strcspn(p, ":");
            snprintf(buf, cap, "%.*s/%s", (int)len, p, wanted);
            if (len && access(buf, X_OK) == 0 && !is_me(buf))
                return buf;
            p += len + (p[len] == ':');
        }
    }
    snprintf(why, why_cap, "cannot find the real runtime '%s' (set %s)", wanted, RUNTIME_ENV);
    return NULL;
}

/* Whether config.json may ask for a slice: it mentions one of MARKS.  Only
 * then is the daemon asked (and it parses the file properly). */
static int mentions_us(const char *config, char *why, size_t cap)
{
    int fd = open(config, O_RDONLY | O_CLOEXEC);
    size_t n = 0;
    char *text = fd < 0 ? NULL : gs_read_all(fd, &n);
    if (fd >= 0)
        close(fd);
    if (!text) {
        snprintf(why, cap, "cannot read %.1024s: %s", config, strerror(errno));
        return -1;
    }
    int found = 0;
    for (const char *const *m = MARKS; *m && !found; m++)
        found = memmem(text, n, *m, strlen(*m)) != NULL;
    free(text);
    return found;
}

static int prepare(const struct command_line *c, char *why, size_t cap)
{
    char bundle[PATH_MAX], config[PATH_MAX + 16];
    if (!realpath(c->bundle ? c->bundle : ".", bundle)) {
        snprintf(why, cap, "bundle %s: %s", c->bundle ? c->bundle : ".", strerror(errno));
        return -1;
    }
    snprintf(config, sizeof config, "%s/config.json", bundle);
    int asks = mentions_us(config, why, cap);
    if (asks <= 0)
        return asks;
    if (strchr(bundle, '\n') || strchr(c->id, '\n')) {
        snprintf(why, cap, "create %s: the container id or bundle path holds a newline", c->id);
        return -1;
    }
    const char *spec = getenv(SPEC_ENV);
    char id_kv[PATH_MAX], bundle_kv[PATH_MAX + 8], spec_kv[PATH_MAX + 8];
    snprintf(id_kv, sizeof id_kv, "id=%s", c->id);
    snprintf(bundle_kv, sizeof bundle_kv, "bundle=%s", bundle);
    snprintf(spec_kv, sizeof spec_kv, "spec=%s", spec && *spec ? spec : "");
    const char *keys[] = {id_kv, bundle_kv, spec_kv, NULL};
    return gs_runtime_call("create", keys, NULL, 0, why, cap) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    struct command_line c = {0};
    parse(argc, argv, &c);
    char buf[PATH_MAX], why[GS_REPLY_MAX];
    const char *runtime = real_runtime(buf, sizeof buf, why, sizeof why);
    if (!runtime) {
        report(&c, why);
        return 1;
    }
    if (c.command && strcmp(c.command, "create") == 0 && c.id && prepare(&c, why, sizeof why) != 0) {
        report(&c, why);
        return 1;
    }
    argv[0] = (char *)runtime;
    execv(runtime, argv);
    snprintf(why, sizeof why, "cannot run %.1024s: %s", runtime, strerror(errno));
    report(&c, why);
    return 1;
}

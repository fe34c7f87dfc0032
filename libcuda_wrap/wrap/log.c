/* Messages to the user: one line on stderr, in one write(); never exit(). */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "wrap.h"

void gs_log(int always, const char *fmt, ...)
{
    static int verbose = -1;
    if (verbose < 0) {
        const char *v = getenv("GPUSLICE_LOG");
        verbose = v && *v && *v != '0';
    }
    if (!always && !verbose)
        return;
    char buf[512];
    int n = snprintf(buf, sizeof buf, "gpuslice: ");
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        return;
    n += m;
    if (n > (int)sizeof buf - 2)
        n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, (size_t)n);
    (void)w;
}

/* The hook's and the runtime shim's one round trip to the daemon, over its
 * root-only runtime socket (docs/oci-integration.md, "Runtime socket").
 *
 * Request: the verb on a line, "key=value" lines, an empty line, then the
 * payload to the end (the client shuts down its writing side).
 * Reply: one line, "ok" or "ok VALUE", or "error MESSAGE". */
#ifndef GPUSLICE_RUNTIME_CALL_H
#define GPUSLICE_RUNTIME_CALL_H

#include <stddef.h>

#include "gpuslice_constants.h"

#define GS_CALL_TIMEOUT_S GS_RUNTIME_TIMEOUT_S
#define GS_REPLY_MAX GS_RUNTIME_REPLY_MAX
#define GS_INPUT_MAX ((size_t)GS_RUNTIME_REQUEST_MAX)

/* The runtime socket: beside the control socket ($GPUSLICE_SOCKET, or the
 * default), so one setting points every client at one daemon. */
const char *gs_runtime_socket(char *buf, size_t cap);

/* keys: "key=value" strings, NULL-terminated (or NULL).  Returns 0 when the
 * daemon answered ok (its value, maybe empty, in reply), 1 when it answered
 * error (its line in reply), -1 when there was no answer (why, in reply). */
int gs_runtime_call(const char *verb, const char *const *keys, const char *payload, size_t n, char *reply,
                    size_t cap);

/* All of fd (stdin, a file) into a malloc'd, NUL-terminated buffer of at
 * most GS_INPUT_MAX bytes; NULL with errno set otherwise. */
char *gs_read_all(int fd, size_t *n);

#endif

/*
 * Node paths and protocol constants: the one source for the C programs (the
 * hook, the runtime shim, the interposer) and for Python (gpuslice/constants.py
 * reads this very file).  Only `#define GS_NAME "string"` and
 * `#define GS_NAME integer` lines, so both sides parse it the same way.
 */
#ifndef GPUSLICE_CONSTANTS_H
#define GPUSLICE_CONSTANTS_H

/* the daemon's sockets and state on a node */
#define GS_CONTROL_SOCKET "/run/gpuslice/gpuslice.sock"
#define GS_RUNTIME_SOCKET_NAME "runtime.sock"
#define GS_SLICE_SOCKET_DIR "/run/gpuslice/slice"
#define GS_SLICE_SOCKET_NAME "slice.sock"
#define GS_SLICE_SOCKET "/run/gpuslice/slice/slice.sock"
#define GS_STATE_DIR "/var/lib/gpuslice"
#define GS_SLICE_FILES_DIR "/run/gpuslice/ledgers"

/* the slice socket: how long the interposer waits for the daemon's answer
 * before cuInit fails (the daemon gives each client 2 s for its request) */
#define GS_SLICE_TIMEOUT_S 10

/* environment: which daemon a client talks to, and the interposer's settings */
#define GS_ENV_SOCKET "GPUSLICE_SOCKET"
#define GS_ENV_SLICE_SOCKET "GPUSLICE_SLICE_SOCKET"
#define GS_ENV_REAL_LIBCUDA "GPUSLICE_REAL_LIBCUDA"
#define GS_ENV_REAL_LIBNVML "GPUSLICE_REAL_LIBNVML"
#define GS_ENV_RUNTIME "GPUSLICE_RUNTIME"
#define GS_ENV_CDI_SPEC "GPUSLICE_CDI_SPEC"

/* the runtime socket (docs/oci-integration.md): one request, one reply line */
#define GS_RUNTIME_TIMEOUT_S 30
#define GS_RUNTIME_REQUEST_MAX 4194304
#define GS_RUNTIME_REPLY_MAX 4096

/* CDI: the kind, and the env entry by which an injected GPU names itself */
#define GS_CDI_KIND "gpuslice.io/gpu"
#define GS_CDI_DEVICE_ENV_PREFIX "GPUSLICE_DEVICE_"
/* DRA: the kind of a claim's CDI devices; each device of a share sets one env
 * entry with this prefix, "<claim UID>/<share>/<membership key>", so a
 * container names exactly the shares it was given and proves it was given
 * them.  GS_ENV_CLAIM=<UID>, what specs before per-share devices set, is
 * refused: anyone can write a UID. */
#define GS_CDI_CLAIM_KIND "gpuslice.io/claim"
#define GS_ENV_SHARE_PREFIX "GPUSLICE_SHARE_"
#define GS_ENV_CLAIM "GPUSLICE_CLAIM"
/* the daemon's container ID of a claim's slice: this prefix and the claim's UID */
#define GS_CLAIM_SLICE_PREFIX "claim-"
/* the daemon's container ID of a device plugin's allocation (the units the
 * kubelet gave one container of one resource): this prefix and a digest of
 * the resource and its device IDs; containers name its shares as a claim's */
#define GS_DEVICES_SLICE_PREFIX "dp-"

/* inside a container: where the interposer and the real driver libraries sit */
#define GS_CONTAINER_WRAP_DIR "/usr/lib/gpuslice/wrap"
#define GS_CONTAINER_DRIVER_DIR "/usr/lib/gpuslice/driver"

#endif

"""The request contract: a container's gpuslice.io/* annotations parsed into a
SliceRequest.  The one parser, shared by the shim, the hook, the CLI and the
daemon; every bad value raises one line naming the annotation (or the
environment variable), the value and what is accepted.

Where a request comes from, in order of precedence, key by key:
1. annotations: the container's own, or a Kubernetes pod's, which the CRI
   copies into every container of the pod (its sandbox excepted);
2. environment variables that mirror them (GPUSLICE_MEMORY for
   gpuslice.io/memory), for engines that put no annotations into the OCI
   spec, such as Docker before 24.

gpuslice.io/containers (a pod annotation) names the containers of the pod that
get a slice; the others, sidecars, get none."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from gpuslice import errors
from gpuslice.units import parse_bytes

PREFIX = "gpuslice.io/"
GPUS = PREFIX + "gpus"
MEMORY = PREFIX + "memory"
CORES = PREFIX + "cores"
POLICY = PREFIX + "compute-policy"
PRIORITY = PREFIX + "priority"
DEVICE = PREFIX + "device"
AVOID_DEVICE = PREFIX + "avoid-device"
DEVICE_TYPE = PREFIX + "device-type"
AVOID_DEVICE_TYPE = PREFIX + "avoid-device-type"
GPU_POLICY = PREFIX + "gpu-policy"  # of the GPUs it may be given and fits, the fullest (binpack) or emptiest (spread)
# which of a node's GPUs the container may be given, and which of them first
WHERE = (DEVICE, AVOID_DEVICE, DEVICE_TYPE, AVOID_DEVICE_TYPE, GPU_POLICY)
# a slice of several GPUs: all of them on one NUMA node (as HAMi's nvidia.com/numa-bind), or none
NUMA_BIND = PREFIX + "numa-bind"
KNOWN = (GPUS, MEMORY, CORES, POLICY, PRIORITY, *WHERE, NUMA_BIND)
CONTAINERS = PREFIX + "containers"  # which containers of a pod a pod-wide request is for
ANNOTATIONS = (*KNOWN, CONTAINERS)
MAX_GPUS = 64
ENV_PREFIX = "GPUSLICE_"
# The CRI's container name, by implementation: containerd's, CRI-O's.
CONTAINER_NAME_MARKS = ("io.kubernetes.cri.container-name", "io.kubernetes.container.name")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z", re.ASCII)


def env_name(key: str) -> str:
    """The environment variable that mirrors an annotation: GPUSLICE_COMPUTE_POLICY."""
    return ENV_PREFIX + key[len(PREFIX) :].upper().replace("-", "_")


ENV_NAMES = {env_name(key): key for key in KNOWN}

_UUID = re.compile(r"^GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\Z", re.ASCII)
# ASCII digits and blanks only: \d and int() would take other scripts' digits (fullwidth "16")
_PERCENT = re.compile(r"^[ \t]*([0-9]{1,3})[ \t]*%[ \t]*\Z", re.ASCII)
_WHOLE = re.compile(r"^[ \t]*([0-9]{1,6})[ \t]*\Z", re.ASCII)
_INDEX = re.compile(r"^[0-9]{1,4}\Z", re.ASCII)
# a GPU type: a word of the product's name as NVML gives it ("A100" of "NVIDIA A100-SXM4-40GB")
TYPE_WORD = re.compile(r"^[0-9A-Za-z][0-9A-Za-z ._-]{0,63}\Z", re.ASCII)
MAX_VALUE = 1024  # characters in one value: a device list of 64 UUIDs fits


class RequestError(errors.InvalidArgument):
    """A bad annotation; str() is the one line to show the user."""


class ComputePolicy(str, Enum):
    ELASTIC = "elastic"
    HARD = "hard"


class GpuPolicy(str, Enum):
    """Of the GPUs a container may be given that it fits: the fullest (binpack: large
    holes stay free) or the emptiest (spread: fewer neighbours), as HAMi's
    hami.io/gpu-scheduler-policy."""

    BINPACK = "binpack"
    SPREAD = "spread"


class Priority(str, Enum):
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


@dataclass(frozen=True)
class MemoryLimit:
    """Per-GPU memory: exact bytes, or a percentage of each placed GPU."""

    bytes: int | None = None
    percent: int | None = None

    def resolve(self, gpu_total: int) -> int:
        return self.bytes if self.bytes is not None else gpu_total * (self.percent or 0) // 100


@dataclass(frozen=True)
class GpuChoice:
    """Which of a node's GPUs a container may be given: one of `devices` (by
    index or UUID) where any are named, none of `avoid`, and one whose name
    contains one of `types` (ignoring case, as HAMi's use-gputype) where any
    are named and none of `avoid_types`."""

    devices: tuple[str, ...] = ()
    avoid: tuple[str, ...] = ()
    types: tuple[str, ...] = ()
    avoid_types: tuple[str, ...] = ()
    # not which GPUs but which first, of those that fit: the emptiest (binpack: the fullest)
    spread: bool = False

    def __bool__(self) -> bool:
        """Whether it rules any GPU out (the order it asks rules none out)."""
        return bool(self.devices or self.avoid or self.types or self.avoid_types)

    def refusal(self, index: int, uuid: str, name: str) -> str | None:
        """Why the GPU is not one the container may be given; None when it is."""
        keys = {str(index), uuid}
        upper = name.upper()
        if self.devices and not keys & set(self.devices):
            return f"not one of {DEVICE} {','.join(self.devices)}"
        if keys & set(self.avoid):
            return f"one of {AVOID_DEVICE} {','.join(self.avoid)}"
        if self.types and not any(t.upper() in upper for t in self.types):
            return f"{name or 'its name unknown'}, not of {DEVICE_TYPE} {','.join(self.types)}"
        if any(t.upper() in upper for t in self.avoid_types):
            return f"{name}, of {AVOID_DEVICE_TYPE} {','.join(self.avoid_types)}"
        return None

    def admits(self, index: int, uuid: str, name: str) -> bool:
        return self.refusal(index, uuid, name) is None


@dataclass(frozen=True)
class SliceRequest:
    gpus: int = 1
    memory: MemoryLimit | None = None  # None: the whole memory of each GPU
    cores: int | None = None  # compute share per GPU, 1-100; None: no guaranteed share
    policy: ComputePolicy = ComputePolicy.ELASTIC
    priority: Priority = Priority.NORMAL
    devices: tuple[str, ...] = ()  # pinned GPU indices or UUIDs
    avoid_devices: tuple[str, ...] = ()  # GPUs by index or UUID it must not be given
    device_types: tuple[str, ...] = ()  # words of a GPU's name, one of which its GPUs' names contain
    avoid_device_types: tuple[str, ...] = ()  # words none of which its GPUs' names contain
    gpu_policy: GpuPolicy = GpuPolicy.BINPACK  # of those it may be given and fits, the fullest or the emptiest
    numa_bind: bool = False  # its GPUs all on one NUMA node (gpuslice.io/numa-bind)

    @property
    def choice(self) -> GpuChoice:
        """Which GPUs it may be given, and which first."""
        return GpuChoice(self.devices, self.avoid_devices, self.device_types, self.avoid_device_types,
                         self.gpu_policy is GpuPolicy.SPREAD)  # fmt: skip

    @property
    def whole_gpus(self) -> bool:
        """Neither a memory limit nor a partial share: whole GPUs."""
        return self.memory is None and self.cores in (None, 100)


@dataclass(frozen=True)
class Asked:
    """A container's request as gathered from its sources: values by annotation
    key, and how to name each value's source in an error."""

    values: dict[str, str]
    sources: dict[str, str]

    def __bool__(self) -> bool:
        return bool(self.values)


NOTHING = Asked({}, {})


def _containers(value: str) -> set[str]:
    names = [part.strip() for part in value.split(",")] if len(value) <= MAX_VALUE else [""]
    if not all(_DNS_LABEL.match(n) for n in names):
        raise RequestError(
            f'annotation {CONTAINERS}: "{_shown(value)}" is not valid; accepted: comma-separated container names '
            "(lowercase DNS labels: a-z, 0-9 and -, at most 63 characters)"
        )
    return set(names)


def _container_name(annotations: Mapping[str, str]) -> str | None:
    return next((annotations[m] for m in CONTAINER_NAME_MARKS if annotations.get(m)), None)


def gather(annotations: Mapping[str, str], env: Sequence[str] = ()) -> Asked:
    """What one container asks for: its gpuslice.io/* annotations over the
    GPUSLICE_* environment variables that mirror them, key by key.  Nothing for
    a container that gpuslice.io/containers leaves out."""
    values: dict[str, str] = {}
    sources: dict[str, str] = {}
    for entry in env:
        name, sep, value = entry.partition("=")
        if sep and name in ENV_NAMES:
            values[ENV_NAMES[name]] = value
            sources[ENV_NAMES[name]] = f"environment variable {name}"
    for key, value in annotations.items():
        if key.startswith(PREFIX) and key != CONTAINERS:
            values[key] = value
            sources[key] = f"annotation {key}"
    if CONTAINERS in annotations:
        wanted = _containers(annotations[CONTAINERS])
        container = _container_name(annotations)
        if container is None:
            raise RequestError(
                f"annotation {CONTAINERS}: this container has no CRI container name "
                f"({' or '.join(CONTAINER_NAME_MARKS)}); accepted: only on a Kubernetes pod's containers"
            )
        if container not in wanted:
            return NOTHING
    return Asked(values, sources)


def _shown(value: str) -> str:
    """A value as an error line shows it: printable ASCII, at most 64 characters."""
    text = value.encode("unicode_escape").decode("ascii")
    return text if len(text) <= 64 else text[:64] + "..."


def _bad(label: str, value: str, accepted: str) -> RequestError:
    return RequestError(f'{label}: "{_shown(value)}" is not valid; accepted: {accepted}')


def _int_in(label: str, value: str, lo: int, hi: int, accepted: str) -> int:
    m = _WHOLE.match(value)
    if not m or not lo <= int(m.group(1)) <= hi:
        raise _bad(label, value, accepted)
    return int(m.group(1))


def _memory(label: str, value: str) -> MemoryLimit:
    accepted = "bytes with a unit (4Gi, 1500Mi, 2G; at most 1Pi) or a percentage of the GPU from 1% to 100% (25%)"
    pct = _PERCENT.match(value)
    if pct:
        p = int(pct.group(1))
        if not 1 <= p <= 100:
            raise _bad(label, value, accepted)
        return MemoryLimit(percent=p)
    try:
        n = parse_bytes(value)
    except ValueError:
        raise _bad(label, value, accepted) from None
    if n <= 0:
        raise _bad(label, value, accepted)
    return MemoryLimit(bytes=n)


def _devices(label: str, value: str) -> tuple[str, ...]:
    accepted = "comma-separated GPU indices or UUIDs, each once (0,1 or GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)"
    items = tuple(part.strip() for part in value.split(","))
    for item in items:
        if not (_INDEX.match(item) or _UUID.match(item)):
            raise _bad(label, value, accepted)
    if len(set(items)) != len(items):
        raise _bad(label, value, accepted)
    return items


def _types(label: str, value: str) -> tuple[str, ...]:
    accepted = ("comma-separated words of a GPU's name, each once (A100,H100; letters, digits, space, . _ -, "
                "at most 64 characters a word)")  # fmt: skip
    items = tuple(part.strip() for part in value.split(","))
    if not all(TYPE_WORD.match(t) for t in items) or len({t.upper() for t in items}) != len(items):
        raise _bad(label, value, accepted)
    return items


def _where(ours: Mapping[str, str], label: Callable[[str], str]) -> GpuChoice:
    """Which GPUs the request may be given, each value checked."""
    return GpuChoice(
        _devices(label(DEVICE), ours[DEVICE]) if DEVICE in ours else (),
        _devices(label(AVOID_DEVICE), ours[AVOID_DEVICE]) if AVOID_DEVICE in ours else (),
        _types(label(DEVICE_TYPE), ours[DEVICE_TYPE]) if DEVICE_TYPE in ours else (),
        _types(label(AVOID_DEVICE_TYPE), ours[AVOID_DEVICE_TYPE]) if AVOID_DEVICE_TYPE in ours else (),
        GPU_POLICY in ours and _choice(label(GPU_POLICY), ours[GPU_POLICY], GpuPolicy) is GpuPolicy.SPREAD,
    )


def _choice(label: str, value: str, enum: type[Enum]) -> Enum:
    try:
        return enum(value.strip().lower())
    except ValueError:
        raise _bad(label, value, " or ".join(e.value for e in enum)) from None


def _flag(label: str, value: str) -> bool:
    word = value.strip().lower()
    if word not in ("true", "false"):
        raise _bad(label, value, "true or false")
    return word == "true"


@dataclass(frozen=True)
class Parsed:
    """A request parsed once: what it asks, and our annotations as given (kept
    with the slice, and compared when the same container asks again)."""

    request: SliceRequest
    annotations: dict[str, str]


def read(asked: Asked) -> Parsed | None:
    """The request gathered from a container's sources, parsed once; None when
    it asks for no GPU. Bad values fail with one line naming their source."""
    ours = {k: v for k, v in asked.values.items() if k.startswith(PREFIX)}
    req = _parse_ours(ours, asked.sources)
    return None if req is None else Parsed(req, ours)


def parse(annotations: Mapping[str, str], sources: Mapping[str, str] | None = None) -> SliceRequest | None:
    """The container's request, or None when it asks for no GPU.  `sources`
    names where each value came from (gather's), for the error line."""
    return _parse_ours({k: v for k, v in annotations.items() if k.startswith(PREFIX)}, sources)


def _parse_ours(ours: Mapping[str, str], sources: Mapping[str, str] | None) -> SliceRequest | None:
    if not ours:
        return None

    def label(key: str) -> str:
        return (sources or {}).get(key, f"annotation {key}")

    for key, value in ours.items():
        if key not in KNOWN:
            raise RequestError(f"annotation {_shown(key)}: unknown; accepted annotations: {', '.join(ANNOTATIONS)}")
        if not value.isascii() or len(value) > MAX_VALUE:
            raise _bad(label(key), value, f"ASCII text of at most {MAX_VALUE} characters")
    where = _where(ours, label)
    devices = where.devices
    default_gpus = len(devices) or 1
    accepted_gpus = f"a whole number from 1 to {MAX_GPUS}"
    gpus = _int_in(label(GPUS), ours[GPUS], 1, MAX_GPUS, accepted_gpus) if GPUS in ours else None
    if devices and gpus is not None and gpus > len(devices):
        raise RequestError(
            f'{label(GPUS)}: "{gpus}" asks for more GPUs than {DEVICE} pins ({len(devices)}); '
            f"accepted: at most {len(devices)}"
        )
    accepted_cores = "a whole number from 1 to 100 (100 = the whole GPU)"
    return SliceRequest(
        gpus=gpus if gpus is not None else default_gpus,
        memory=_memory(label(MEMORY), ours[MEMORY]) if MEMORY in ours else None,
        cores=_int_in(label(CORES), ours[CORES], 1, 100, accepted_cores) if CORES in ours else None,
        policy=_choice(label(POLICY), ours[POLICY], ComputePolicy) if POLICY in ours else ComputePolicy.ELASTIC,  # type: ignore[arg-type]
        priority=_choice(label(PRIORITY), ours[PRIORITY], Priority) if PRIORITY in ours else Priority.NORMAL,  # type: ignore[arg-type]
        devices=devices,
        avoid_devices=where.avoid,
        device_types=where.types,
        avoid_device_types=where.avoid_types,
        gpu_policy=GpuPolicy.SPREAD if where.spread else GpuPolicy.BINPACK,
        numa_bind=_flag(label(NUMA_BIND), ours[NUMA_BIND]) if NUMA_BIND in ours else False,
    )


COMPUTE_ONLY = (POLICY, PRIORITY)  # what a container whose slice the device plugin sized may still ask
# ... and which GPUs it may be given, which the plugin heeds and the container's start checks
SIZED_ELSEWHERE = (*COMPUTE_ONLY, *WHERE)


@dataclass(frozen=True)
class SizedElsewhere:
    """What a container whose slice the device plugin sized asks of it besides."""

    policy: ComputePolicy = ComputePolicy.ELASTIC
    priority: Priority = Priority.NORMAL
    choice: GpuChoice = GpuChoice()


def read_compute(asked: Asked) -> SizedElsewhere:
    """The policy, priority and GPU choice of a container whose size comes
    from elsewhere (the device plugin's resources): a size asked here too is
    refused, since kube-scheduler would not have counted it."""
    sized = sorted(k for k in asked.values if k in KNOWN and k not in SIZED_ELSEWHERE)
    if sized:
        raise RequestError(
            f"{asked.sources.get(sized[0], sized[0])}: the container's slice is sized by its gpuslice.io/* resource "
            f"limits (the device plugin); accepted here: {', '.join(SIZED_ELSEWHERE)}"
        )
    req = _parse_ours(asked.values, asked.sources)  # the one parser: its checks and its one-line errors
    return SizedElsewhere(req.policy, req.priority, req.choice) if req else SizedElsewhere()

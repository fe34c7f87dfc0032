"""The request contract: a container's gpuslice.io/* annotations parsed into a
SliceRequest.  The one parser, shared by the shim, the hook, the CLI and the
daemon; every bad value raises one line naming the annotation, the value and
what is accepted."""

from __future__ import annotations

import re
from collections.abc import Mapping
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
KNOWN = (GPUS, MEMORY, CORES, POLICY, PRIORITY, DEVICE)
MAX_GPUS = 64

_UUID = re.compile(r"^GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")
_PERCENT = re.compile(r"^\s*(\d+)\s*%\s*$")


class RequestError(errors.InvalidArgument):
    """A bad annotation; str() is the one line to show the user."""


class ComputePolicy(str, Enum):
    ELASTIC = "elastic"
    HARD = "hard"


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
class SliceRequest:
    gpus: int = 1
    memory: MemoryLimit | None = None  # None: the whole memory of each GPU
    cores: int | None = None  # compute share per GPU, 1-100; None: no guaranteed share
    policy: ComputePolicy = ComputePolicy.ELASTIC
    priority: Priority = Priority.NORMAL
    devices: tuple[str, ...] = ()  # pinned GPU indices or UUIDs

    @property
    def whole_gpus(self) -> bool:
        """Neither a memory limit nor a partial share: whole GPUs."""
        return self.memory is None and self.cores in (None, 100)


def _bad(key: str, value: str, accepted: str) -> RequestError:
    return RequestError(f'annotation {key}: "{value}" is not valid; accepted: {accepted}')


def _int_in(key: str, value: str, lo: int, hi: int, accepted: str) -> int:
    if not re.fullmatch(r"\s*\d+\s*", value) or not lo <= int(value) <= hi:
        raise _bad(key, value, accepted)
    return int(value)


def _memory(value: str) -> MemoryLimit:
    accepted = "bytes with a unit (4Gi, 1500Mi, 2G) or a percentage of the GPU from 1% to 100% (25%)"
    pct = _PERCENT.match(value)
    if pct:
        p = int(pct.group(1))
        if not 1 <= p <= 100:
            raise _bad(MEMORY, value, accepted)
        return MemoryLimit(percent=p)
    try:
        n = parse_bytes(value)
    except ValueError:
        raise _bad(MEMORY, value, accepted) from None
    if n <= 0:
        raise _bad(MEMORY, value, accepted)
    return MemoryLimit(bytes=n)


def _devices(value: str) -> tuple[str, ...]:
    accepted = "comma-separated GPU indices or UUIDs, each once (0,1 or GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)"
    items = tuple(part.strip() for part in value.split(","))
    for item in items:
        if not (re.fullmatch(r"\d+", item) or _UUID.match(item)):
            raise _bad(DEVICE, value, accepted)
    if len(set(items)) != len(items):
        raise _bad(DEVICE, value, accepted)
    return items


def _choice(key: str, value: str, enum: type[Enum]) -> Enum:
    try:
        return enum(value.strip().lower())
    except ValueError:
        raise _bad(key, value, " or ".join(e.value for e in enum)) from None


def parse(annotations: Mapping[str, str]) -> SliceRequest | None:
    """The container's request, or None when it asks for no GPU."""
    ours = {k: v for k, v in annotations.items() if k.startswith(PREFIX)}
    if not ours:
        return None
    for key in ours:
        if key not in KNOWN:
            raise RequestError(f"annotation {key}: unknown; accepted annotations: {', '.join(KNOWN)}")
    devices = _devices(ours[DEVICE]) if DEVICE in ours else ()
    default_gpus = len(devices) or 1
    gpus = _int_in(GPUS, ours[GPUS], 1, MAX_GPUS, f"a whole number from 1 to {MAX_GPUS}") if GPUS in ours else None
    if devices and gpus is not None and gpus > len(devices):
        raise RequestError(
            f'annotation {GPUS}: "{gpus}" asks for more GPUs than {DEVICE} pins ({len(devices)}); '
            f"accepted: at most {len(devices)}"
        )
    return SliceRequest(
        gpus=gpus if gpus is not None else default_gpus,
        memory=_memory(ours[MEMORY]) if MEMORY in ours else None,
        cores=_int_in(CORES, ours[CORES], 1, 100, "a whole number from 1 to 100 (100 = the whole GPU)")
        if CORES in ours
        else None,
        policy=_choice(POLICY, ours[POLICY], ComputePolicy) if POLICY in ours else ComputePolicy.ELASTIC,  # type: ignore[arg-type]
        priority=_choice(PRIORITY, ours[PRIORITY], Priority) if PRIORITY in ours else Priority.NORMAL,  # type: ignore[arg-type]
        devices=devices,
    )

"""What a pod written for HAMi or Volcano's vGPU asks, read once into types,
and the same asked in gpuslice's words.

HAMi's words (its device plugin's flags and chart values: resourceName,
resourceMem, resourceMemPercentage, resourceCores, resourcePriority; defaults
nvidia.com/gpu, nvidia.com/gpumem, nvidia.com/gpumem-percentage,
nvidia.com/gpucores, nvidia.com/priority): per container, in
resources.limits, how many vGPUs, each one's memory in MiB or as a
percentage of its GPU, its cores as a percentage of the GPU, a priority.
A container with memory or cores but no count gets one vGPU (HAMi's webhook
adds its DefaultGPUNum, 1). Volcano's vGPU (volcano.sh/vgpu-number,
volcano.sh/vgpu-memory in MiB, volcano.sh/vgpu-cores) runs the same
HAMi-core. Annotations: nvidia.com/use-gpuuuid and nouse-gpuuuid (devices
by UUID, comma-separated), use-gpuindexes and nouse-gpuindexes (by index),
nvidia.com/use-gputype and nouse-gputype, and hami.io/gpu-scheduler-policy
(binpack or spread). A vGPU of 100 % of the memory is a whole GPU (HAMi's
use_exclusive_card example: gpumem-percentage 100, gpucores 100)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gpuslice import errors

MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True)
class Names:
    """The resource names one sharing layer's pods ask in."""

    layer: str
    count: str
    memory: str
    memory_percentage: str
    cores: str
    priority: str = ""


HAMI = Names("HAMi", "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores",
             "nvidia.com/priority")  # fmt: skip
VOLCANO = Names("Volcano", "volcano.sh/vgpu-number", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-memory-percentage",
                "volcano.sh/vgpu-cores")  # fmt: skip

USE_UUID, NOUSE_UUID = "nvidia.com/use-gpuuuid", "nvidia.com/nouse-gpuuuid"
USE_INDEX, NOUSE_INDEX = "nvidia.com/use-gpuindexes", "nvidia.com/nouse-gpuindexes"
USE_TYPE, NOUSE_TYPE = "nvidia.com/use-gputype", "nvidia.com/nouse-gputype"
POLICY = "hami.io/gpu-scheduler-policy"
NODE_POLICY = "hami.io/node-scheduler-policy"  # binpack or spread among nodes: the extender's is chart-wide
NUMA_BIND = "nvidia.com/numa-bind"  # "true": a container's GPUs on one NUMA node
VGPU_MODE = "nvidia.com/vgpu-mode"  # hami-core (HAMi's default) or mig
PINS = (USE_UUID, USE_INDEX)  # the GPUs a pod may run on, one of them per vGPU: gpuslice.io/device's meaning


@dataclass(frozen=True)
class Ask:
    """One container's GPUs in a sharing layer's words. memory_mib and
    memory_percent are per vGPU (None: not said; a whole GPU's when neither
    and no cores are said either)."""

    names: Names
    gpus: int
    memory_mib: int | None = None
    memory_percent: int | None = None
    cores: int | None = None
    priority: int | None = None

    @property
    def whole(self) -> bool:
        """Only a count: whole GPUs, as the NVIDIA device plugin gives them; or
        all of each GPU's memory, which leaves no room for another tenant."""
        alone = self.memory_mib is None and self.memory_percent is None and self.cores is None
        return alone or self.memory_percent == 100


def _integer(names: Names, key: str, value: object, low: int, high: int, what: str) -> int:
    text = str(value).strip()
    if not text.isdigit() or not low <= int(text) <= high:
        raise errors.InvalidArgument(f"{key}: {value!r} is not {what}; accepted: an integer from {low} to {high}")
    return int(text)


def read(limits: dict[str, object], names: Names) -> Ask | None:
    """What a container's limits ask in `names`'s words, or None if nothing."""
    said = {k: limits[k] for k in (names.count, names.memory, names.memory_percentage, names.cores, names.priority)
            if k and k in limits}  # fmt: skip
    if not said:
        return None
    gpus = _integer(names, names.count, said[names.count], 1, 64, "a vGPU count") if names.count in said else 1
    memory = percent = cores = priority = None
    if names.memory in said:
        memory = _integer(names, names.memory, said[names.memory], 1, 1 << 24, "MiB of GPU memory")
    if names.memory_percentage in said:
        percent = _integer(names, names.memory_percentage, said[names.memory_percentage], 1, 100, "a percentage")
    if memory is not None and percent is not None:
        raise errors.InvalidArgument(
            f"{names.memory} and {names.memory_percentage} together; accepted: one of them per container"
        )
    if names.cores in said:
        cores = _integer(names, names.cores, said[names.cores], 0, 100, "a percentage of the GPU") or None
    if names.priority and names.priority in said:
        priority = _integer(names, names.priority, said[names.priority], 0, 1, "a priority")
    return Ask(names, gpus, memory, percent, cores, priority)


def numa_bind(annotations: Mapping[str, object]) -> bool | None:
    """nvidia.com/numa-bind as a yes or no ("true" or "false", any case); None: not said, or a
    value neither (left on the pod, recorded as not translated)."""
    said = str(annotations.get(NUMA_BIND) or "").strip().lower()
    return {"true": True, "false": False}.get(said)


def listed(annotations: Mapping[str, object], key: str) -> list[str]:
    """An annotation's comma-separated values, as HAMi writes them (spaces around each dropped)."""
    return [w.strip() for w in str(annotations.get(key) or "").split(",") if w.strip()]


def memory_units(ask: Ask, unit: int = GiB) -> int | None:
    """The memory asked per vGPU in the device plugin's units (GiB by
    default), rounded up: a slice never holds less than was asked."""
    return None if ask.memory_mib is None else math.ceil(ask.memory_mib * MiB / unit)


def priority_word(ask: Ask) -> str | None:
    """HAMi's task priority (0 high, 1 low) as gpuslice's."""
    return None if ask.priority is None else ("high" if ask.priority == 0 else "low")

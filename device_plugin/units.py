"""What the device plugin publishes: each GPU as countable units of three
extended resources, and the device IDs that name them.

- `gpuslice.io/memory`: one unit per GiB of the GPU's memory. A GiB keeps an
  8 x 80 GiB node at 640 devices (the kubelet lists, checkpoints and sends
  them all in each ListAndWatch update), and reads as what users ask for
  (`gpuslice.io/memory: 16` is 16 GiB). GPUManager's 256 MiB would be 2,560
  devices there, for a granularity few workloads need.
- `gpuslice.io/cores`: 100 per GPU, a GPU's compute in percent.
- `gpuslice.io/gpu`: the whole GPU, one per GPU.

A device ID names its GPU by UUID (stable across reboots and renumbering, as
the kubelet's checkpoint needs) and its place among the GPU's units."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuslice import errors

GIB = 1 << 30
PREFIX = "gpuslice.io/"
MEMORY, CORES, GPU = PREFIX + "memory", PREFIX + "cores", PREFIX + "gpu"
RESOURCES = (MEMORY, CORES, GPU)
CORES_PER_GPU = 100
_KIND = {MEMORY: "m", CORES: "c", GPU: "g"}
_RESOURCE = {v: k for k, v in _KIND.items()}
_ID = re.compile(r"^(GPU-[0-9a-fA-F-]+)_([mcg])(\d+)$")


@dataclass(frozen=True)
class Unit:
    gpu: str  # the GPU's UUID
    resource: str
    index: int

    @property
    def id(self) -> str:
        return f"{self.gpu}_{_KIND[self.resource]}{self.index}"


def parse(device_id: str) -> Unit:
    m = _ID.match(device_id)
    if not m:
        raise errors.InvalidArgument(
            f"device ID {device_id!r} is not one of gpuslice's (accepted: <GPU UUID>_m<n>, _c<n> or _g0)"
        )
    return Unit(m.group(1), _RESOURCE[m.group(2)], int(m.group(3)))


def count(resource: str, memory_total: int) -> int:
    """How many units of `resource` a GPU with `memory_total` bytes has."""
    return {MEMORY: memory_total // GIB, CORES: CORES_PER_GPU, GPU: 1}[resource]


def units(gpu: str, resource: str, memory_total: int) -> list[Unit]:
    return [Unit(gpu, resource, i) for i in range(count(resource, memory_total))]


def by_gpu(device_ids: list[str]) -> dict[str, list[Unit]]:
    """The units named, grouped by GPU UUID, in the order given."""
    grouped: dict[str, list[Unit]] = {}
    for device_id in device_ids:
        unit = parse(device_id)
        grouped.setdefault(unit.gpu, []).append(unit)
    return grouped

"""Where a slice goes: pure functions over the GPUs' free capacity.

Fractional slices go best-fit onto one GPU (the fullest GPU that still fits,
so large holes stay free); whole GPUs need an empty GPU; multi-GPU requests
are all-or-nothing and prefer the closest set (NVLink, then PCIe distance
from NVML).  Pinned devices restrict the candidates or are refused with a
reason."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations

from gpuslice import errors
from gpuslice.request import SliceRequest
from gpuslice.units import format_bytes


class NoRoom(errors.ResourceExhausted):
    """Nothing fits now; it may later."""


class CannotFit(errors.InvalidArgument):
    """The request can never fit on this node."""


@dataclass(frozen=True)
class GpuCapacity:
    index: int
    uuid: str
    memory_total: int
    memory_reserved: int = 0
    cores_reserved: int = 0
    slices: int = 0
    exclusive: bool = False


@dataclass(frozen=True)
class Placement:
    index: int
    uuid: str
    memory: int
    cores: int


def demand(req: SliceRequest, gpu: GpuCapacity) -> tuple[int, int]:
    """Memory and cores the request needs on this GPU."""
    if req.whole_gpus:
        return gpu.memory_total, 100
    cores = req.cores or 0  # memory only: no guaranteed share, idle compute only
    if req.memory is None:  # only a compute share: memory in proportion
        return gpu.memory_total * cores // 100, cores
    return req.memory.resolve(gpu.memory_total), cores


def fits(req: SliceRequest, gpu: GpuCapacity, oversubscription: float) -> bool:
    if gpu.exclusive or (req.whole_gpus and gpu.slices):
        return False
    memory, cores = demand(req, gpu)
    return gpu.memory_reserved + memory <= gpu.memory_total * oversubscription and gpu.cores_reserved + cores <= 100


def _candidates(req: SliceRequest, gpus: Sequence[GpuCapacity]) -> list[GpuCapacity]:
    if not req.devices:
        return list(gpus)
    by_key = {str(g.index): g for g in gpus} | {g.uuid: g for g in gpus}
    unknown = [d for d in req.devices if d not in by_key]
    if unknown:
        have = ", ".join(f"{g.index} ({g.uuid})" for g in gpus)
        raise CannotFit(f"gpuslice.io/device: no GPU {', '.join(unknown)} on this node; it has {have}")
    return [by_key[d] for d in req.devices]


def _leftover(req: SliceRequest, gpu: GpuCapacity, oversubscription: float) -> int:
    return int(gpu.memory_total * oversubscription) - gpu.memory_reserved - demand(req, gpu)[0]


def describe(gpus: Sequence[GpuCapacity], oversubscription: float) -> str:
    return "; ".join(
        f"GPU {g.index} ({g.uuid}): "
        + (
            "held whole"
            if g.exclusive
            else f"{format_bytes(max(0, int(g.memory_total * oversubscription) - g.memory_reserved))} and "
            f"{max(0, 100 - g.cores_reserved)} cores free"
        )
        for g in gpus
    )


def _too_big(req: SliceRequest, candidates: Sequence[GpuCapacity], oversubscription: float) -> str | None:
    if req.gpus > len(candidates):
        return f"asks for {req.gpus} GPUs, {'pinned to' if req.devices else 'node has'} {len(candidates)}"
    empty = [GpuCapacity(g.index, g.uuid, g.memory_total) for g in candidates]
    if sum(fits(req, g, oversubscription) for g in empty) < req.gpus:
        need = format_bytes(demand(req, candidates[0])[0])
        return f"needs {need} per GPU, more than any GPU holds"
    return None


def place(
    req: SliceRequest,
    gpus: Sequence[GpuCapacity],
    distance: Callable[[int, int], int],
    oversubscription: float = 1.0,
) -> list[Placement]:
    candidates = _candidates(req, gpus)
    reason = _too_big(req, candidates, oversubscription)
    if reason:
        raise CannotFit(f"request {reason}")
    fitting = [g for g in candidates if fits(req, g, oversubscription)]
    if len(fitting) < req.gpus:
        memory, cores = demand(req, candidates[0])
        what = "a whole GPU" if req.whole_gpus else f"{format_bytes(memory)} and {cores} cores"
        raise NoRoom(
            f"no room for {req.gpus} x {what}: {describe(candidates, oversubscription)}",
        )
    if req.gpus == 1:
        best = min(fitting, key=lambda g: (_leftover(req, g, oversubscription), g.index))
        chosen: tuple[GpuCapacity, ...] = (best,)
    else:

        def cost(group: tuple[GpuCapacity, ...]) -> tuple[int, int, list[int]]:
            spread = sum(distance(a.index, b.index) for a, b in combinations(group, 2))
            return spread, sum(_leftover(req, g, oversubscription) for g in group), [g.index for g in group]

        chosen = min(combinations(fitting, req.gpus), key=cost)
    return [Placement(g.index, g.uuid, *demand(req, g)) for g in chosen]

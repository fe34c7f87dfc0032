"""Which units a container gets: all of one resource on one GPU, and the GPU
of its other resource where the kubelet has just allocated one.

The kubelet allocates each extended resource of a container separately, in
the order of a Go map, with no pod in the call (pkg/kubelet/cm/devicemanager,
`allocateContainerResources` -> `devicesToAllocate`, which asks the plugin's
GetPreferredAllocation with the available devices, those that must be
included and the size, then calls Allocate). It admits one pod at a time, so
a container's resources come back to back: what was allocated last, moments
ago, for the other resource is the same container's, and this module steers
the next one onto its GPU (`Partner`). The daemon checks the pair exactly at
createRuntime, from the container's own environment; this only makes the
kubelet's choice agree with it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations
from math import comb

from gpuslice import errors
from gpuslice.device_plugin import units as u


@dataclass(frozen=True)
class Partner:
    """The other resource's units just allocated: their GPU, and when (monotonic s)."""

    resource: str
    gpu: str
    at: float


def free_by_gpu(available: list[str]) -> dict[str, list[str]]:
    return {gpu: [x.id for x in found] for gpu, found in u.by_gpu(available).items()}


def describe(resource: str, free: dict[str, list[str]], size: int) -> str:
    have = ", ".join(f"{gpu} has {len(ids)}" for gpu, ids in sorted(free.items())) or "no GPU has any"
    return f"{size} {resource} must lie on one GPU; free: {have}"


def prefer(
    resource: str, available: list[str], must_include: list[str], size: int, partner: Partner | None = None
) -> list[str]:
    """`size` units of `resource` from `available`, all on one GPU: the GPU of
    `must_include` (a restarted container's), else the partner's, else the
    fullest GPU that fits (binpacking leaves whole GPUs whole)."""
    free = free_by_gpu(available)
    if must_include:
        gpus = set(u.by_gpu(must_include))
        if len(gpus) != 1:
            raise errors.FailedPrecondition(f"{resource}: the devices kept for the container span GPUs {sorted(gpus)}")
        order = list(gpus)
    else:
        fitting = sorted((g for g, ids in free.items() if len(ids) >= size), key=lambda g: (len(free[g]), g))
        order = fitting
        if partner and partner.resource != resource and partner.gpu in fitting:
            order = [partner.gpu] + [g for g in fitting if g != partner.gpu]
    for gpu in order:
        kept = [d for d in must_include if u.parse(d).gpu == gpu]
        rest = [d for d in free.get(gpu, []) if d not in kept]
        if len(kept) + len(rest) >= size:
            return kept + rest[: size - len(kept)]
    raise errors.ResourceExhausted(describe(resource, free, size))


MAX_SETS = 4096  # sets of whole GPUs weighed one by one; past it, the nearest added one at a time

Apart = Callable[[str, str], tuple[int, int]]  # two GPUs (UUIDs): (across NUMA nodes 0/1, distance)


def prefer_whole(available: list[str], must_include: list[str], size: int, apart: Apart) -> list[str]:
    """`size` whole GPUs (a gpuslice.io/gpu unit each) from `available`: those of `must_include`,
    then the set that crosses NUMA nodes least, then the closest (NVLink, then PCIe), as the
    daemon places a multi-GPU slice; raises naming how many are free."""
    free = {gpu: found[0].id for gpu, found in u.by_gpu(available).items()}
    kept = sorted(u.by_gpu(must_include))
    others = sorted(g for g in free if g not in kept)
    need = size - len(kept)
    if need < 0 or need > len(others):
        raise errors.ResourceExhausted(f"{size} {u.GPU}: {len(kept) + len(others)} free")

    def cost(group: tuple[str, ...]) -> tuple[int, int, tuple[str, ...]]:
        pairs = [apart(a, b) for a, b in combinations(group, 2)]
        return sum(p[0] for p in pairs), sum(p[1] for p in pairs), group

    if comb(len(others), need) <= MAX_SETS:
        chosen = min((tuple(kept) + c for c in combinations(others, need)), key=cost)
    else:  # many GPUs: grown from those kept (or the first) by the nearest each time
        chosen = tuple(kept) or (others[0],)
        while len(chosen) < size:
            chosen += (min((g for g in others if g not in chosen), key=lambda g: cost((*chosen, g))),)
    return sorted(d for g in chosen for d in ([x.id for x in u.by_gpu(must_include).get(g, [])] or [free[g]]))


def one_gpu(resource: str, device_ids: list[str], available_after: list[str]) -> str:
    """The GPU that all of `device_ids` lie on, or the one-line refusal the
    kubelet shows as the pod's UnexpectedAdmissionError."""
    gpus = u.by_gpu(device_ids)
    if len(gpus) == 1:
        return next(iter(gpus))
    free = free_by_gpu(available_after + device_ids)
    raise errors.FailedPrecondition(describe(resource, free, len(device_ids)))

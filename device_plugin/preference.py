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

from dataclasses import dataclass

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


def one_gpu(resource: str, device_ids: list[str], available_after: list[str]) -> str:
    """The GPU that all of `device_ids` lie on, or the one-line refusal the
    kubelet shows as the pod's UnexpectedAdmissionError."""
    gpus = u.by_gpu(device_ids)
    if len(gpus) == 1:
        return next(iter(gpus))
    free = free_by_gpu(available_after + device_ids)
    raise errors.FailedPrecondition(describe(resource, free, len(device_ids)))

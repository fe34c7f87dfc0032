"""Where a slice goes: pure functions over the GPUs' free capacity.

Fractional slices go best-fit onto one GPU (the fullest GPU that still fits,
so large holes stay free), or onto the emptiest where the request asks to be
spread (`gpuslice.io/gpu-policy: spread`); whole GPUs need an empty GPU; multi-GPU requests
are all-or-nothing and prefer the closest set (NVLink, then PCIe distance
from NVML), and where the request asks it (`gpuslice.io/numa-bind`) take
only sets on one NUMA node.  Pinned devices restrict the candidates or are
refused with a reason."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import combinations

from gpuslice import errors
from gpuslice import request as requests
from gpuslice.allocator.records import Allocation
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
    name: str = ""  # the product's name, as NVML gives it


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
    """The GPUs the request may be given: those pinned, in its order, less
    those its choice rules out; none at all is a request this node cannot serve."""
    have = ", ".join(f"{g.index} ({g.uuid}{', ' + g.name if g.name else ''})" for g in gpus)
    pinned = list(gpus)
    if req.devices:
        by_key = {str(g.index): g for g in gpus} | {g.uuid: g for g in gpus}
        unknown = [d for d in req.devices if d not in by_key]
        if unknown:
            raise CannotFit(f"{requests.DEVICE}: no GPU {', '.join(unknown)} on this node; it has {have}")
        pinned = [by_key[d] for d in req.devices]
    choice = req.choice
    allowed = [g for g in pinned if choice.admits(g.index, g.uuid, g.name)]
    if not allowed:
        why = "; ".join(f"GPU {g.index}: {choice.refusal(g.index, g.uuid, g.name)}" for g in pinned)
        raise CannotFit(f"no GPU of this node is one the request may be given ({why}); it has {have}")
    return allowed


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
        where = "pinned to" if req.devices else "may be given" if req.choice else "node has"
        return f"asks for {req.gpus} GPUs, {where} {len(candidates)}"
    empty = [GpuCapacity(g.index, g.uuid, g.memory_total) for g in candidates]
    if sum(fits(req, g, oversubscription) for g in empty) < req.gpus:
        need = format_bytes(demand(req, candidates[0])[0])
        return f"needs {need} per GPU, more than any GPU holds"
    return None


def _numa_nodes(gpus: Sequence[GpuCapacity], same_numa: Callable[[int, int], bool]) -> list[list[GpuCapacity]]:
    """`gpus` grouped by NUMA node: each with the first of a group that it shares one with."""
    groups: list[list[GpuCapacity]] = []
    for g in gpus:
        home = next((grp for grp in groups if same_numa(grp[0].index, g.index)), None)
        if home is None:
            groups.append([g])
        else:
            home.append(g)
    return groups


def _sets(req: SliceRequest, fitting: Sequence[GpuCapacity], same_numa: Callable[[int, int], bool] | None
          ) -> Iterator[tuple[GpuCapacity, ...]]:  # fmt: skip
    """The sets of req.gpus GPUs it may take of those that fit: any, or with numa-bind those of one NUMA node."""
    if not req.numa_bind or same_numa is None:
        yield from combinations(fitting, req.gpus)
        return
    for group in _numa_nodes(fitting, same_numa):
        yield from combinations(group, req.gpus)


def _numa_too_few(req: SliceRequest, candidates: Sequence[GpuCapacity], oversubscription: float,
                  same_numa: Callable[[int, int], bool] | None) -> str | None:  # fmt: skip
    """Why numa-bind can never hold on this node: no NUMA node has req.gpus GPUs it could take empty."""
    if not req.numa_bind or same_numa is None or req.gpus < 2:
        return None
    empty = [g for g in candidates if fits(req, GpuCapacity(g.index, g.uuid, g.memory_total), oversubscription)]
    most = max((len(grp) for grp in _numa_nodes(empty, same_numa)), default=0)
    if most >= req.gpus:
        return None
    return (f"asks for {req.gpus} GPUs on one NUMA node ({requests.NUMA_BIND}); the most the node has on one "
            f"is {most}")  # fmt: skip


def place(
    req: SliceRequest,
    gpus: Sequence[GpuCapacity],
    distance: Callable[[int, int], int],
    oversubscription: float = 1.0,
    same_numa: Callable[[int, int], bool] | None = None,
) -> list[Placement]:
    """Where the slice goes; `same_numa` says whether two GPUs are on one NUMA node (numa-bind's
    constraint; None: not known, the constraint is not held)."""
    candidates = _candidates(req, gpus)
    reason = _too_big(req, candidates, oversubscription) or _numa_too_few(req, candidates, oversubscription, same_numa)
    if reason:
        raise CannotFit(f"request {reason}")
    fitting = [g for g in candidates if fits(req, g, oversubscription)]
    memory, cores = demand(req, candidates[0])
    what = "a whole GPU" if req.whole_gpus else f"{format_bytes(memory)} and {cores} cores"
    if len(fitting) < req.gpus:
        raise NoRoom(
            f"no room for {req.gpus} x {what}: {describe(candidates, oversubscription)}",
        )
    # binpack: the fullest that fits, so large holes stay free; spread (gpuslice.io/gpu-policy): the emptiest
    sign = -1 if req.gpu_policy is requests.GpuPolicy.SPREAD else 1
    if req.gpus == 1:  # spread's ties: the GPU fewer slices share
        best = min(fitting, key=lambda g: (sign * _leftover(req, g, oversubscription), g.slices if sign < 0 else 0,
                                           g.index))  # fmt: skip
        chosen: tuple[GpuCapacity, ...] = (best,)
    else:

        def cost(group: tuple[GpuCapacity, ...]) -> tuple[int, int, list[int]]:
            apart = sum(distance(a.index, b.index) for a, b in combinations(group, 2))
            return apart, sign * sum(_leftover(req, g, oversubscription) for g in group), [g.index for g in group]

        found = min(_sets(req, fitting, same_numa), key=cost, default=None)
        if found is None:
            raise NoRoom(f"no room for {req.gpus} x {what} on one NUMA node ({requests.NUMA_BIND}): "
                         f"{describe(candidates, oversubscription)}")  # fmt: skip
        chosen = found
    return [Placement(g.index, g.uuid, *demand(req, g)) for g in chosen]


@dataclass(frozen=True)
class ShareRequest:
    """One share of a claim as the scheduler placed it: a GPU by index, and
    what of it (memory None: the whole memory, or in proportion to cores;
    cores None: no guaranteed share; both None: the whole GPU)."""

    gpu_index: int
    memory: int | None = None
    cores: int | None = None
    policy: requests.ComputePolicy = requests.ComputePolicy.ELASTIC
    priority: requests.Priority = requests.Priority.NORMAL
    share: str = ""  # tells shares on one GPU apart (the DRA share ID, the device plugin's resource)

    def request(self) -> SliceRequest:
        memory = None if self.memory is None else requests.MemoryLimit(bytes=self.memory)
        return SliceRequest(1, memory, self.cores, self.policy, self.priority)


def place_shares(
    what: str, shares: Sequence[ShareRequest], caps: Sequence[GpuCapacity], oversubscription: float
) -> list[tuple[ShareRequest, GpuCapacity, int, int]]:
    """Each share with its GPU, memory and cores, after checking that each GPU
    exists and that what the shares take of it fits beside what the others
    hold (`caps`); ordered by GPU, then share."""
    by_index = {c.index: c for c in caps}
    by_gpu: dict[int, list[ShareRequest]] = {}
    for s in shares:
        if s.gpu_index not in by_index:
            have = ", ".join(str(i) for i in sorted(by_index))
            raise CannotFit(f"{what}: no GPU {s.gpu_index} on this node; it has {have}")
        by_gpu.setdefault(s.gpu_index, []).append(s)
    placed = []
    for index, on_gpu in sorted(by_gpu.items()):
        cap = by_index[index]
        if len({s.share for s in on_gpu}) != len(on_gpu) or "/" in "".join(s.share for s in on_gpu):
            raise errors.InvalidArgument(f"{what}: two shares of GPU {index} with one share ID, or a share ID with '/'")
        asked = [s.request() for s in on_gpu]
        wanted = [demand(r, cap) for r in asked]
        whole = any(r.whole_gpus for r in asked)
        memory, cores = sum(m for m, _ in wanted), sum(c for _, c in wanted)
        total = SliceRequest() if whole else SliceRequest(1, requests.MemoryLimit(memory), cores)
        empty = GpuCapacity(cap.index, cap.uuid, cap.memory_total)
        if (whole and len(on_gpu) > 1) or not fits(total, empty, oversubscription):
            raise CannotFit(f"request needs {format_bytes(memory)} per GPU, more than any GPU holds")
        if not fits(total, cap, oversubscription):
            held = "a whole GPU" if whole else f"{format_bytes(memory)} and {cores} cores"
            raise NoRoom(f"no room for {held}: {describe([cap], oversubscription)}")
        placed += sorted(((s, cap, m, c) for s, (m, c) in zip(on_gpu, wanted, strict=True)), key=lambda p: p[0].share)
    return placed


def resized(req: SliceRequest, allocs: Sequence[Allocation], used: Sequence[int], caps: Sequence[GpuCapacity],
            oversubscription: float) -> list[Allocation]:  # fmt: skip
    """A container's slice at its new size on the same GPUs, if each has room
    for it (`caps`: without the slice) and no GPU's new memory is below what
    the slice uses there (`used`, per allocation)."""
    by_uuid = {c.uuid: c for c in caps}
    new = []
    for i, a in enumerate(allocs):
        cap = by_uuid[a.gpu_uuid]
        memory, cores = demand(req, cap)
        if not fits(req, cap, oversubscription):
            raise NoRoom(f"no room for the new size ({format_bytes(memory)} and {cores} cores) beside the other "
                         f"slices: {describe([cap], oversubscription)}")  # fmt: skip
        if i < len(used) and memory < used[i]:
            raise errors.FailedPrecondition(
                f"slice uses {format_bytes(used[i])} on GPU {a.gpu_index}, more than the new limit "
                f"{format_bytes(memory)}"
            )
        new.append(Allocation(a.gpu_index, a.gpu_uuid, memory, cores))
    return new

"""Whether a pod's containers fit a node GPU by GPU, as the device plugin
places them: each container's memory and cores on one GPU (the fullest that
fits, or the emptiest for a container whose GPU policy is spread, as
admission.fitting chooses), whole GPUs on GPUs with no slice. The
scheduler extender's filter and score rest on this."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpuslice.device_plugin import units as u
from gpuslice.device_plugin.admission import Asks
from gpuslice.device_plugin.node_gpus import GpuFree

Free = dict[str, GpuFree]  # by GPU UUID


@dataclass(frozen=True)
class Take:
    """What one container takes of one GPU."""

    gpu: str
    memory: int = 0
    cores: int = 0
    whole: bool = False


def taken(free: Free, takes: list[Take]) -> Free:
    """`free` less `takes` (those on GPUs it does not have are ignored)."""
    left = dict(free)
    for t in takes:
        if t.gpu not in left:
            continue
        f = left[t.gpu]
        if t.whole:
            left[t.gpu] = replace(f, memory=0, cores=0, whole=False)
        else:
            left[t.gpu] = replace(f, memory=max(0, f.memory - t.memory), cores=max(0, f.cores - t.cores), whole=False)
    return left


def _have(free: Free) -> str:
    return "; ".join(f"{g} has {f.memory} memory and {f.cores} cores" for g, f in sorted(free.items())) or "no GPU"


def _may_have(free: Free, who: Asks | None) -> tuple[Free, str]:
    """Of `free`, the GPUs the container may be given, and why the others not ("" when all)."""
    if who is None:
        return free, ""
    why = {g: r for g, f in free.items() if (r := who.refusal(f.index, g, f.name))}
    return {g: f for g, f in free.items() if g not in why}, "; ".join(f"{g}: {r}" for g, r in sorted(why.items()))


def place(containers: list[dict[str, int]], free: Free, choices: Sequence[Asks | None] = ()) -> list[Take] | str:
    """What each container takes, or why the pod does not fit (one line).
    `choices`: each container's own (admission.Asks), whose GPU choice rules
    out the GPUs it may not be given."""
    left = dict(free)
    takes: list[Take] = []
    for i, asks in enumerate(containers):
        whole = asks.get(u.GPU, 0)
        memory, cores = asks.get(u.MEMORY, 0), asks.get(u.CORES, 0)
        mine, ruled_out = _may_have(left, choices[i] if i < len(choices) else None)
        if (whole or memory or cores) and not mine:
            return f"container {i} may be given none of the node's GPUs ({ruled_out})"
        if whole:
            idle = sorted(g for g, f in mine.items() if f.whole)
            if len(idle) < whole:
                return f"container {i} asks {whole} whole GPUs; {len(idle)} have no slice"
            now = [Take(g, whole=True) for g in idle[:whole]]
        elif memory or cores:
            who = choices[i] if i < len(choices) else None
            sign = -1 if who is not None and who.choice.spread else 1  # spread: the emptiest first
            fitting = sorted(
                (g for g, f in mine.items() if f.memory >= memory and f.cores >= cores),
                key=lambda g: (sign * (left[g].memory + left[g].cores), g),
            )
            if not fitting:
                return f"container {i} asks {memory} memory and {cores} cores on one GPU; free: {_have(mine)}"
            now = [Take(fitting[0], memory, cores)]
        else:
            continue
        left = taken(left, now)
        takes.extend(now)
    return takes


def score(containers: list[dict[str, int]], free: Free, spread: bool = False, choices: Sequence[Asks | None] = ()
          ) -> int:  # fmt: skip
    """0-10 (the extender's MaxExtenderPriority): how full the node's GPU
    memory would be after the pod (binpack), or how empty (spread); 0 where
    it does not fit."""
    takes = place(containers, free, choices)
    total = sum(f.memory_units for f in free.values())
    if isinstance(takes, str) or not total:
        return 0
    after = taken(free, takes)
    used = total - sum(f.memory for f in after.values())
    full = max(0, min(10, round(10 * used / total)))
    return 10 - full if spread else full

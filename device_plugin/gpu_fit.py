"""Whether a pod's containers fit a node GPU by GPU, as the device plugin will
place them: each container's memory and cores on one GPU (the fullest that
fits, as admission.fitting chooses), whole GPUs on GPUs with no slice. The
scheduler extender's filter and score rest on this (issue 28, in progress).

`free` is per GPU UUID: {"memory": units, "cores": units, "whole": bool}
(whole: the GPU holds no slice, so it can be given whole)."""

from __future__ import annotations

from gpuslice.device_plugin import units as u

Free = dict[str, dict[str, int]]


def place(containers: list[dict[str, int]], free: Free) -> dict[str, str] | str:
    """Each container's GPU(s) by its index, or why the pod does not fit (one line)."""
    left = {g: dict(f) for g, f in free.items()}
    placed: dict[str, str] = {}
    for i, asks in enumerate(containers):
        whole = asks.get(u.GPU, 0)
        memory, cores = asks.get(u.MEMORY, 0), asks.get(u.CORES, 0)
        if whole:
            idle = sorted(g for g, f in left.items() if f.get("whole"))
            if len(idle) < whole:
                return f"container {i} asks {whole} whole GPUs; {len(idle)} have no slice"
            for g in idle[:whole]:
                left[g] = {"memory": 0, "cores": 0, "whole": 0}
            placed[str(i)] = ",".join(idle[:whole])
            continue
        if not memory and not cores:
            continue
        fitting = sorted((g for g, f in left.items() if f["memory"] >= memory and f["cores"] >= cores),
                         key=lambda g: (left[g]["memory"] + left[g]["cores"], g))  # fmt: skip
        if not fitting:
            have = "; ".join(f"{g} has {f['memory']} memory and {f['cores']} cores" for g, f in sorted(left.items()))
            return f"container {i} asks {memory} memory and {cores} cores on one GPU; free: {have or 'no GPU'}"
        g = fitting[0]
        left[g] = {"memory": left[g]["memory"] - memory, "cores": left[g]["cores"] - cores, "whole": 0}
        placed[str(i)] = g
    return placed


def score(containers: list[dict[str, int]], free: Free, totals: dict[str, int], spread: bool = False) -> int:
    """0-10 (the extender's MaxExtenderPriority): how full the node's GPUs
    would be after the pod (binpack), or how empty (spread); 0 where it does not fit."""
    if isinstance(place(containers, free), str) or not totals.get("memory"):
        return 0
    asked = sum(c.get(u.MEMORY, 0) for c in containers)
    used = totals["memory"] - sum(f["memory"] for f in free.values()) + asked
    full = max(0, min(10, round(10 * used / totals["memory"])))
    return 10 - full if spread else full

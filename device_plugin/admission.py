"""Which container the kubelet is allocating for, and the GPU its whole ask
fits on: what makes "each container's slice lies on one GPU" exact.

The kubelet allocates one resource at a time, with no pod in the call, but:
- it admits one pod at a time, and adds the pod to its pod manager before
  admitting it (kubelet.go, HandlePodAdditions), so the pod-resources List
  shows the pod being admitted;
- within a pod it allocates container by container (init containers first),
  and records each resource's devices as soon as Allocate returns
  (devicemanager `allocateContainerResources` -> `podDevices.insert`), calling
  the plugin outside its lock, so a List made during the next call shows
  them;
- a container's limits are in its pod's spec, which the API server has.

So during a call for `size` units of `resource`: the container being admitted
is the first one, in the kubelet's order, of a pending pod the kubelet knows,
that asks exactly that and holds none of it yet. When exactly one pod has
such a container the answer is exact, and the plugin knows everything the
container asks and what it already holds (the other resource's GPU). When the
API or the pod-resources service cannot tell (no access, or two pending pods
alike), `identify` returns None and the plugin steers by what it allocated
last (preference.Partner); the daemon still refuses a split slice when the
container starts."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuslice import request
from gpuslice.device_plugin import units as u

_WHOLE = re.compile(r"^[0-9]+\Z")


@dataclass(frozen=True)
class Asks:
    """One container of ours, as the pod's spec has it."""

    pod: str  # namespace/name
    container: str
    limits: dict[str, int]  # our resources -> units
    choice: request.GpuChoice = field(default_factory=request.GpuChoice)  # the GPUs it may be given (its env)
    refused: str = ""  # why none: its environment asks what the container's start would refuse

    def refusal(self, index: int, uuid: str, name: str) -> str | None:
        """Why the container may not be given this GPU; None when it may."""
        return self.refused or self.choice.refusal(index, uuid, name)


@dataclass(frozen=True)
class PendingPod:
    name: str  # namespace/name
    containers: tuple[Asks, ...]  # in the kubelet's order: init containers, then containers


@dataclass
class Held:
    """What the kubelet holds, from the pod-resources service: each
    container's units of our resources, and every unit it can allocate."""

    by_container: dict[tuple[str, str], dict[str, list[str]]] = field(default_factory=dict)
    pods: set[str] = field(default_factory=set)  # namespace/name of every pod the kubelet knows
    allocatable: dict[str, list[str]] = field(default_factory=dict)  # resource -> unit IDs

    def free(self, resource: str) -> dict[str, int]:
        """Free units of `resource` per GPU UUID (every GPU that has any unit of it)."""
        taken = {d for held in self.by_container.values() for d in held.get(resource, ())}
        counts: dict[str, int] = {}
        for device_id in self.allocatable.get(resource, ()):
            gpu = u.parse(device_id).gpu
            counts[gpu] = counts.get(gpu, 0) + (device_id not in taken)
        return counts


@dataclass(frozen=True)
class Admitting:
    """The container being allocated for: what it asks, and the GPU of what it holds already."""

    asks: Asks
    held_gpu: str | None
    holds: frozenset[str] = frozenset()  # the resources it has been given already

    @property
    def name(self) -> str:
        return f"{self.asks.pod}/{self.asks.container}"


def _units(value: Any) -> int | None:
    text = str(value)
    return int(text) if _WHOLE.match(text) else None  # extended resources are whole numbers


def _where(container: dict[str, Any]) -> tuple[request.GpuChoice, str]:
    """Which GPUs a container's environment lets it be given, read by the
    parser its start reads it with; what that would refuse, in one line."""
    env, unknown = [], []
    for e in container.get("env") or ():
        if not isinstance(e, dict) or e.get("name") not in request.ENV_NAMES:
            continue
        if "value" not in e and e.get("valueFrom") is not None:
            unknown.append(str(e["name"]))  # a ConfigMap's or a field's: the API holds only where it comes from
        env.append(f"{e['name']}={e.get('value') or ''}")
    if unknown:
        line = (f"environment variable {unknown[0]} of container {container.get('name', '')} comes from "
                "valueFrom; accepted for gpuslice's: a value written in the pod")  # fmt: skip
        return request.GpuChoice(), line
    try:
        return request.read_compute(request.gather({}, env)).choice, ""
    except request.RequestError as e:
        return request.GpuChoice(), f"container {container.get('name', '')}: {e}"


def asks_of(pod: dict[str, Any]) -> PendingPod | None:
    """A pending pod's containers that ask our resources, in the kubelet's order; None if none does."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    name = f"{meta.get('namespace')}/{meta.get('name')}"
    found = []
    for c in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        limits = ((c.get("resources") or {}).get("limits")) or {}
        ours = {r: n for r in u.RESOURCES if r in limits and (n := _units(limits[r])) is not None}
        found.append(Asks(name, c.get("name", ""), ours, *_where(c)) if ours else Asks(name, c.get("name", ""), ours))
    if not any(a.limits for a in found):
        return None
    return PendingPod(name, tuple(a for a in found if a.limits))


def identify(resource: str, size: int, pending: Iterable[PendingPod], held: Held) -> Admitting | None:
    found = []
    for pod in pending:
        if pod.name not in held.pods:
            continue  # not admitted yet: the kubelet adds a pod just before it admits it
        for c in pod.containers:
            mine = held.by_container.get((pod.name, c.container), {})
            if c.limits.get(resource) == size and resource not in mine:
                found.append((c, mine))
                break
    if len(found) != 1:
        return None
    asks, mine = found[0]
    gpus = {u.parse(d).gpu for r, ids in mine.items() if r != u.GPU for d in ids}
    return Admitting(asks, next(iter(gpus)) if len(gpus) == 1 else None, frozenset(mine))


def _ask_line(asks: Asks) -> str:
    return " and ".join(f"{n} {r}" for r, n in sorted(asks.limits.items()) if r != u.GPU)


def fitting(who: Admitting, held: Held, gpus_named: Mapping[str, tuple[int, str]] | None = None
            ) -> tuple[list[str], str]:  # fmt: skip
    """GPUs on which everything the container asks (memory and cores) fits,
    fullest first (emptiest first where its GPU policy is spread), and the one
    line that refuses it where none does.
    `gpus_named`: each GPU's index and name by UUID, which the container's
    GPU choice is held against (none: it has no choice to hold)."""
    wanted = {r: n for r, n in who.asks.limits.items() if r != u.GPU and r not in who.holds}
    free = {r: held.free(r) for r in wanted}
    gpus = sorted({g for counts in free.values() for g in counts})
    if who.held_gpu:
        gpus = [who.held_gpu]
    ruled_out = refusals(who, gpus, gpus_named or {})
    if ruled_out and len(ruled_out) == len(gpus):
        why = "; ".join(f"{g}: {r}" for g, r in sorted(ruled_out.items()))
        return [], f"container {who.name} may be given none of this node's GPUs ({why})"
    gpus = [g for g in gpus if g not in ruled_out]
    ok = [g for g in gpus if all(free[r].get(g, 0) >= n for r, n in wanted.items())]
    spread = who.asks.choice.spread  # gpuslice.io/gpu-policy: spread, the emptiest first
    ok.sort(key=lambda g: ((-1 if spread else 1) * sum(free[r].get(g, 0) for r in wanted), g))
    have = "; ".join(
        f"{g} has " + " and ".join(f"{free[r].get(g, 0)} {r.removeprefix(u.PREFIX)}" for r in sorted(wanted))
        for g in gpus
    )
    where = f"on GPU {who.held_gpu}, where it holds the rest" if who.held_gpu else "on one GPU"
    line = f"container {who.name} asks {_ask_line(who.asks)} {where}; free: {have or 'no GPU'}"
    return ok, line


def refusals(who: Admitting, gpus: Iterable[str], gpus_named: Mapping[str, tuple[int, str]]) -> dict[str, str]:
    """Of `gpus`, those the container may not be given, with why."""
    out = {}
    for g in gpus:
        index, name = gpus_named.get(g, (-1, ""))
        why = who.asks.refusal(index, g, name)
        if why:
            out[g] = why
    return out

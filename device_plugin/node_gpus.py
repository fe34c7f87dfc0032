"""What a node's device plugin publishes for the scheduler extender: each
GPU's free units, in one annotation on its Node (`gpuslice.io/gpus`).

The kubelet publishes only a node's totals (allocatable `gpuslice.io/memory`
and so on), and kube-scheduler fits a pod against those; a pod that fits the
totals may fit no single GPU. The annotation carries what the totals hide:

    {"v": 1, "gpus": {"GPU-…": {"memory": 10, "cores": 40, "whole": false,
                                "memoryUnits": 80, "index": 0,
                                "name": "NVIDIA H100 80GB HBM3"}},
     "pods": ["namespace/name", …]}

`memory` and `cores` are the GPU's free units as the kubelet can still give
them (healthy, not taken by a container); `whole` whether the GPU can be given
whole (it holds no slice); `memoryUnits` its size; `index` and `name` what a
container's GPU choice (gpuslice.io/device, device-type and their avoid-
forms) is held against (a plugin before them left both out: -1 and ""). `pods` names every pod
whose containers hold units of ours, so that the extender can tell which of
the pods it placed the node counts already."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gpuslice import errors
from gpuslice.device_plugin import units as u
from gpuslice.device_plugin.admission import Held
from gpuslice.proto import gpuslice_pb2 as pb

ANNOTATION = "gpuslice.io/gpus"
VERSION = 1


@dataclass(frozen=True)
class GpuFree:
    memory: int  # free units of gpuslice.io/memory
    cores: int  # free units of gpuslice.io/cores
    whole: bool  # free to be given whole: no slice on it
    memory_units: int  # its size in gpuslice.io/memory units
    index: int = -1  # its index on its node (-1: not published)
    name: str = ""  # its product's name, as NVML gives it


@dataclass(frozen=True)
class NodeGpus:
    gpus: dict[str, GpuFree]  # by GPU UUID
    pods: frozenset[str]  # namespace/name of the pods holding units of ours

    def encode(self) -> str:
        return json.dumps({
            "v": VERSION,
            "gpus": {g: _gpu(f) for g, f in sorted(self.gpus.items())},
            "pods": sorted(self.pods),
        }, separators=(",", ":"))  # fmt: skip


def _gpu(f: GpuFree) -> dict[str, Any]:
    out: dict[str, Any] = {"memory": f.memory, "cores": f.cores, "whole": f.whole, "memoryUnits": f.memory_units}
    if f.index >= 0:
        out["index"] = f.index
    if f.name:
        out["name"] = f.name
    return out


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise errors.InvalidArgument(f"{ANNOTATION}: {what} is {value!r} (accepted: a whole number from 0)")
    return value


def decode(text: str) -> NodeGpus:
    """The annotation read back; one line naming what is wrong where it is not one."""
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise errors.InvalidArgument(f"{ANNOTATION} is not JSON ({e})") from e
    if not isinstance(raw, dict) or raw.get("v") != VERSION:
        raise errors.InvalidArgument(
            f"{ANNOTATION}: version {raw.get('v') if isinstance(raw, dict) else raw!r} "
            f"(accepted: {VERSION}; a newer plugin than this extender?)"
        )
    gpus: dict[str, GpuFree] = {}
    for gpu, f in (raw.get("gpus") or {}).items():
        if not isinstance(f, dict) or not isinstance(f.get("whole"), bool):
            raise errors.InvalidArgument(
                f"{ANNOTATION}: GPU {gpu} is {f!r} (accepted: memory, cores, whole, memoryUnits)"
            )
        name = f.get("name", "")
        if not isinstance(name, str):
            raise errors.InvalidArgument(f"{ANNOTATION}: GPU {gpu} name is {name!r} (accepted: a string)")
        gpus[gpu] = GpuFree(_count(f.get("memory"), f"{gpu} memory"), _count(f.get("cores"), f"{gpu} cores"),
                            f["whole"], _count(f.get("memoryUnits"), f"{gpu} memoryUnits"),
                            _count(f["index"], f"{gpu} index") if "index" in f else -1, name)  # fmt: skip
    pods = raw.get("pods") or []
    if not isinstance(pods, list) or not all(isinstance(p, str) for p in pods):
        raise errors.InvalidArgument(f"{ANNOTATION}: pods is {pods!r} (accepted: a list of namespace/name)")
    return NodeGpus(gpus, frozenset(pods))


def of_node(gpus: list[pb.Gpu], held: Held) -> NodeGpus:
    """Each GPU's free units, from the daemon's GPUs (health, whole use) and
    the kubelet's holdings (what each container was given)."""
    taken: dict[tuple[str, str], int] = {}
    for per in held.by_container.values():
        for resource, ids in per.items():
            for gpu, found in u.by_gpu(ids).items():
                taken[(gpu, resource)] = taken.get((gpu, resource), 0) + len(found)
    state = {}
    for g in gpus:
        size = u.count(u.MEMORY, g.memory_total)
        used = {r: taken.get((g.uuid, r), 0) for r in u.RESOURCES}
        if g.health or g.exclusive or used[u.GPU]:
            state[g.uuid] = GpuFree(0, 0, False, size, g.index, g.name)  # unhealthy, or held whole: nothing to give
            continue
        state[g.uuid] = GpuFree(max(0, size - used[u.MEMORY]), max(0, u.CORES_PER_GPU - used[u.CORES]),
                                g.slices == 0 and not used[u.MEMORY] and not used[u.CORES], size, g.index,
                                g.name)  # fmt: skip
    pods = {pod for (pod, _), per in held.by_container.items() if per}
    return NodeGpus(state, frozenset(pods))

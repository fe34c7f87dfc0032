"""What the node's GPUs look like, read through NVML (pynvml): the real
driver when present, the simulator when it is loaded. Every read takes its
NVML as an argument (pynvml itself by default), so a test hands it a fake
with the same functions, constants and error types."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpuslice import errors

Nvml = Any  # the pynvml module, or an object with the functions used here (a test's fake)


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    pci_bus_id: str
    memory_total: int
    memory_used: int
    utilization: int
    processes: tuple[GpuProcess, ...] = field(default_factory=tuple)
    compute_capability: str = ""  # "9.0"
    health: str = ""  # "" when healthy, else why not (one line)


@dataclass(frozen=True)
class Inventory:
    driver_version: str
    cuda_version: int
    gpus: tuple[Gpu, ...]
    #: topology[(a, b)] = NVML common-ancestor level name for a != b
    topology: dict[tuple[int, int], str]
    #: nvlink[(a, b)]: NVML reports NVLink peer-to-peer between a and b
    nvlink: dict[tuple[int, int], bool] = field(default_factory=dict)

    def distance(self, a: int, b: int) -> int:
        """Smaller is closer: NVLink beats every PCIe path."""
        if a == b:
            return 0
        return link_distance(self.topology.get((a, b), "system"), bool(self.nvlink.get((a, b))))

    def same_numa(self, a: int, b: int) -> bool:
        """Whether the two GPUs hang off one NUMA node: NVML's common ancestor is the node or
        nearer ("system": the path crosses the CPUs' interconnect; an unknown one is not
        counted as one node)."""
        return a == b or one_numa_node(self.topology.get((a, b), "unknown"))

    def numa_groups(self) -> list[tuple[int, ...]]:
        """The GPUs' indexes by NUMA node (same_numa's groups): the sets numa-bind takes from."""
        groups: list[list[int]] = []
        for g in sorted(g.index for g in self.gpus):
            home = next((grp for grp in groups if self.same_numa(grp[0], g)), None)
            if home is None:
                groups.append([g])
            else:
                home.append(g)
        return [tuple(grp) for grp in groups]


_LEVELS = {
    pynvml.NVML_TOPOLOGY_INTERNAL: "internal",
    pynvml.NVML_TOPOLOGY_SINGLE: "single",
    pynvml.NVML_TOPOLOGY_MULTIPLE: "multiple",
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: "hostbridge",
    pynvml.NVML_TOPOLOGY_NODE: "node",
    pynvml.NVML_TOPOLOGY_SYSTEM: "system",
}


_ONE_NUMA_NODE = frozenset({"internal", "single", "multiple", "hostbridge", "node"})
_DISTANCE = {"internal": 5, "single": 10, "multiple": 20, "hostbridge": 30, "node": 40, "system": 50}


def link_distance(level: str, nvlink: bool) -> int:
    """Two different GPUs' distance from NVML's common ancestor (its level's name) and whether
    NVLink joins them: smaller is closer, NVLink closest."""
    return 1 if nvlink else _DISTANCE.get(level, 60)


def one_numa_node(level: str) -> bool:
    """Whether NVML's common ancestor of two GPUs puts them on one NUMA node."""
    return level in _ONE_NUMA_NODE


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _gpu(nvml: Nvml, index: int) -> Gpu:
    h = nvml.nvmlDeviceGetHandleByIndex(index)
    mem = nvml.nvmlDeviceGetMemoryInfo(h)
    procs = tuple(GpuProcess(p.pid, p.usedGpuMemory or 0) for p in nvml.nvmlDeviceGetComputeRunningProcesses(h))
    return Gpu(
        index=index,
        uuid=_text(nvml.nvmlDeviceGetUUID(h)),
        name=_text(nvml.nvmlDeviceGetName(h)),
        pci_bus_id=_text(nvml.nvmlDeviceGetPciInfo(h).busId),
        memory_total=mem.total,
        memory_used=mem.used,
        utilization=nvml.nvmlDeviceGetUtilizationRates(h).gpu,
        processes=procs,
        compute_capability="{}.{}".format(*nvml.nvmlDeviceGetCudaComputeCapability(h)),
        health=_health(nvml, h),
    )


def _health(nvml: Nvml, handle: object) -> str:
    """Why a GPU should take no new work: uncorrected ECC errors since the
    driver loaded (the GPU needs a reset), or NVML losing it; "" when well."""
    try:
        errors_ = nvml.nvmlDeviceGetTotalEccErrors(
            handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
        )
    except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
        return ""  # no ECC on this GPU: nothing to say
    except pynvml.NVMLError as e:
        return f"NVML cannot read it: {e}"
    return f"{errors_} uncorrected ECC errors" if errors_ else ""


def health(uuid: str, nvml: Nvml = pynvml) -> str:
    """A GPU's health now (see _health); NVML must be loadable."""
    nvml.nvmlInit()
    try:
        return _health(nvml, nvml.nvmlDeviceGetHandleByUUID(uuid.encode()))
    except pynvml.NVMLError as e:
        return f"NVML cannot read it: {e}"
    finally:
        nvml.nvmlShutdown()


class NoDriver(errors.Unavailable):
    """NVML cannot be loaded or initialized: no NVIDIA driver (yet), or it is not loaded."""


def read(nvml: Nvml = pynvml) -> Inventory:
    """Snapshot the GPUs.  NVML must be loadable (real driver or simulator);
    NoDriver, one line, where it is not."""
    try:
        nvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise NoDriver(f"cannot read the GPUs through NVML: {e} (is the NVIDIA driver installed and loaded?)") from None
    try:
        count = nvml.nvmlDeviceGetCount()
        gpus = tuple(_gpu(nvml, i) for i in range(count))
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        topology = {
            (a, b): _LEVELS.get(nvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b]), "unknown")
            for a in range(count)
            for b in range(count)
            if a != b
        }
        nvlink = {
            (a, b): nvml.nvmlDeviceGetP2PStatus(handles[a], handles[b], pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
            == pynvml.NVML_P2P_STATUS_OK
            for a, b in topology
        }
        return Inventory(
            driver_version=_text(nvml.nvmlSystemGetDriverVersion()),
            cuda_version=nvml.nvmlSystemGetCudaDriverVersion(),
            gpus=gpus,
            topology=topology,
            nvlink=nvlink,
        )
    finally:
        nvml.nvmlShutdown()

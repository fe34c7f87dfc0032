"""The node's ResourceSlice (resource.k8s.io/v1): one device per GPU that many
claims may share (allowMultipleAllocations), with consumable `memory` and
`cores` capacity, and attributes to select and place by."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from gpuslice.pci import bus_id as pci_bus_id
from gpuslice.proto import gpuslice_pb2 as pb

DRIVER = "gpuslice.io"
API_VERSION = "resource.k8s.io/v1"
MEMORY_STEP = 256 << 20  # the smallest slice and the granularity kube-scheduler rounds requests up to
# What a request that names no capacity consumes (the requestPolicy defaults):
# no memory named, all of it (the whole GPU: the whole.gpuslice.io class and
# the gpuslice.io/gpu extended resource get exactly that); no cores named, 0
# (an elastic share of idle compute), so that claims naming only memory share.
DEFAULT_CORES = 0
# the standard attributes (k8s.io/dynamic-resource-allocation/deviceattribute)
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"  # "pci<domain>:<bus>", the PCIe root complex
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"  # "<domain>:<bus>:<device>.<function>", lower case
_ROOT_COMPLEX = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}\Z")
# compute capability (major) -> architecture, as NVIDIA names them
ARCHITECTURES = {"7.0": "Volta", "7.2": "Volta", "7.5": "Turing", "8.0": "Ampere", "8.6": "Ampere", "8.7": "Ampere",
                 "8.9": "Ada Lovelace", "9.0": "Hopper", "10.0": "Blackwell", "10.3": "Blackwell",
                 "12.0": "Blackwell", "12.1": "Blackwell"}  # fmt: skip
SAME_PCIE_ROOT = ("internal", "single", "multiple", "hostbridge")  # NVML levels under one host bridge
SAME_NUMA_NODE = (*SAME_PCIE_ROOT, "node")  # ... and on one NUMA node ("system": across the CPUs' interconnect)
# GPUs on one NUMA node share its value (the smallest index among them, not the kernel's node number):
# a claim for several GPUs on one node asks it in a matchAttribute constraint (HAMi's numa-bind)
NUMA_GROUP = "numaGroup"
UNHEALTHY = DRIVER + "/unhealthy"  # the device taint of a GPU the daemon reports unwell


def device_name(index: int) -> str:
    return f"gpu-{index}"


def index_of(device: str) -> int | None:
    m = re.fullmatch(r"gpu-([0-9]{1,4})", device)
    return int(m.group(1)) if m else None


def semver(text: str) -> str:
    """A version as DRA's `version` attributes take it (semantic versioning:
    three numbers, no leading zeros): 580.95.05 -> 580.95.5, 9.0 -> 9.0.0."""
    numbers = [int(p) for p in re.findall(r"[0-9]+", text)][:3]
    return ".".join(str(n) for n in numbers + [0] * (3 - len(numbers)))


def _groups(count: int, joined: list[tuple[int, int]]) -> list[int]:
    """Connected components (the smallest index of each) of GPUs joined pairwise."""
    parent = list(range(count))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for a, b in joined:
        ra, rb = root(a), root(b)
        parent[max(ra, rb)] = min(ra, rb)
    return [root(i) for i in range(count)]


def pcie_root(bus_id: str | None, sysfs: Path) -> str | None:
    """The PCIe root complex above a PCI device, as the kernel names it in
    sysfs (/sys/bus/pci/devices/<bus ID> resolves under /sys/devices/pci<domain>:<bus>/...);
    None where sysfs does not have the device (then the attribute is left out)."""
    if not bus_id:
        return None
    try:
        target = os.path.realpath(sysfs / "bus" / "pci" / "devices" / bus_id, strict=True)
    except OSError:
        return None
    parts = Path(target).relative_to(os.path.realpath(sysfs)).parts if target.startswith(str(sysfs)) else ()
    if len(parts) >= 2 and parts[0] == "devices" and _ROOT_COMPLEX.match(parts[1]):
        return parts[1]
    return None


def _device(gpu: pb.Gpu, driver_version: str, pcie_group: int, nvlink_domain: int, numa_group: int, sysfs: Path
            ) -> dict[str, Any]:  # fmt: skip
    attributes: dict[str, dict[str, Any]] = {
        "uuid": {"string": gpu.uuid},
        "index": {"int": gpu.index},
        "productName": {"string": gpu.name},
        "pcieBusID": {"string": gpu.pci_bus_id},
        "driverVersion": {"version": semver(driver_version)},
        # GPUs under one PCIe host bridge, and GPUs joined by NVLink, share a value:
        # a claim for several GPUs can ask for one in a matchAttribute constraint
        "pcieRoot": {"int": pcie_group},
        "nvlinkDomain": {"int": nvlink_domain},
        NUMA_GROUP: {"int": numa_group},
    }
    # the standard ones, so that a claim can align a GPU with another driver's device (a NIC)
    bus_id = pci_bus_id(gpu.pci_bus_id)
    if bus_id:
        attributes[PCI_BUS_ID] = {"string": bus_id}
    if root := pcie_root(bus_id, sysfs):
        attributes[PCIE_ROOT] = {"string": root}
    if gpu.compute_capability:
        attributes["cudaComputeCapability"] = {"version": semver(gpu.compute_capability)}
        attributes["architecture"] = {"string": ARCHITECTURES.get(gpu.compute_capability, "unknown")}
    step = str(MEMORY_STEP)
    memory = gpu.memory_total - gpu.memory_total % MEMORY_STEP
    taints = [{"key": UNHEALTHY, "effect": "NoSchedule"}] if gpu.health else []
    return {
        "name": device_name(gpu.index),
        "allowMultipleAllocations": True,
        "attributes": attributes,
        "capacity": {
            "memory": {
                "value": str(memory),
                "requestPolicy": {"default": str(memory), "validRange": {"min": step, "step": step}},
            },
            "cores": {
                "value": "100",
                "requestPolicy": {"default": str(DEFAULT_CORES), "validRange": {"min": "0", "max": "100", "step": "1"}},
            },
        },
        # a failing GPU takes no new claims; those running keep it (NoSchedule, not NoExecute)
        **({"taints": taints} if taints else {}),
    }


def build(node: str, inventory: pb.InventoryReply, generation: int, sysfs: Path = Path("/sys")) -> dict[str, Any]:
    """The ResourceSlice for a node's GPUs as the daemon serves them."""
    count = len(inventory.gpus)
    pcie = _groups(count, [(link.a, link.b) for link in inventory.links if link.pcie in SAME_PCIE_ROOT])
    nvlink = _groups(count, [(link.a, link.b) for link in inventory.links if link.nvlinks])
    numa = _groups(count, [(link.a, link.b) for link in inventory.links if link.pcie in SAME_NUMA_NODE])
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node)},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [
                _device(g, inventory.driver_version, pcie[g.index], nvlink[g.index], numa[g.index], sysfs)
                for g in sorted(inventory.gpus, key=lambda g: g.index)
            ],
        },
    }


def slice_name(node: str) -> str:
    return f"{node}-{DRIVER}"

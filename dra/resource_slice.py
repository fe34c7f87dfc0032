"""The node's ResourceSlice (resource.k8s.io/v1): one device per GPU that many
claims may share (allowMultipleAllocations), with consumable `memory` and
`cores` capacity, and attributes to select and place by."""

from __future__ import annotations

import re
from typing import Any

from gpuslice.proto import gpuslice_pb2 as pb

DRIVER = "gpuslice.io"
API_VERSION = "resource.k8s.io/v1"
MEMORY_STEP = 256 << 20  # the smallest slice and the granularity kube-scheduler rounds requests up to
DEFAULT_MEMORY = 1 << 30  # what a request that names no memory consumes
# compute capability (major) -> architecture, as NVIDIA names them
ARCHITECTURES = {"7.0": "Volta", "7.2": "Volta", "7.5": "Turing", "8.0": "Ampere", "8.6": "Ampere", "8.7": "Ampere",
                 "8.9": "Ada Lovelace", "9.0": "Hopper", "10.0": "Blackwell", "10.3": "Blackwell",
                 "12.0": "Blackwell", "12.1": "Blackwell"}  # fmt: skip
SAME_PCIE_ROOT = ("internal", "single", "multiple", "hostbridge")  # NVML levels under one host bridge
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


def _device(gpu: pb.Gpu, driver_version: str, pcie_root: int, nvlink_domain: int) -> dict[str, Any]:
    attributes: dict[str, dict[str, Any]] = {
        "uuid": {"string": gpu.uuid},
        "index": {"int": gpu.index},
        "productName": {"string": gpu.name},
        "pcieBusID": {"string": gpu.pci_bus_id},
        "driverVersion": {"version": semver(driver_version)},
        # GPUs under one PCIe host bridge, and GPUs joined by NVLink, share a value:
        # a claim for several GPUs can ask for one in a matchAttribute constraint
        "pcieRoot": {"int": pcie_root},
        "nvlinkDomain": {"int": nvlink_domain},
    }
    if gpu.compute_capability:
        attributes["cudaComputeCapability"] = {"version": semver(gpu.compute_capability)}
        attributes["architecture"] = {"string": ARCHITECTURES.get(gpu.compute_capability, "unknown")}
    step = str(MEMORY_STEP)
    taints = [{"key": UNHEALTHY, "effect": "NoSchedule"}] if gpu.health else []
    return {
        "name": device_name(gpu.index),
        "allowMultipleAllocations": True,
        "attributes": attributes,
        "capacity": {
            "memory": {
                "value": str(gpu.memory_total - gpu.memory_total % MEMORY_STEP),
                "requestPolicy": {"default": str(DEFAULT_MEMORY), "validRange": {"min": step, "step": step}},
            },
            "cores": {
                "value": "100",
                "requestPolicy": {"default": "100", "validRange": {"min": "1", "max": "100", "step": "1"}},
            },
        },
        # a failing GPU takes no new claims; those running keep it (NoSchedule, not NoExecute)
        **({"taints": taints} if taints else {}),
    }


def build(node: str, inventory: pb.InventoryReply, generation: int) -> dict[str, Any]:
    """The ResourceSlice for a node's GPUs as the daemon serves them."""
    count = len(inventory.gpus)
    pcie = _groups(count, [(link.a, link.b) for link in inventory.links if link.pcie in SAME_PCIE_ROOT])
    nvlink = _groups(count, [(link.a, link.b) for link in inventory.links if link.nvlinks])
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node)},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [
                _device(g, inventory.driver_version, pcie[g.index], nvlink[g.index])
                for g in sorted(inventory.gpus, key=lambda g: g.index)
            ],
        },
    }


def slice_name(node: str) -> str:
    return f"{node}-{DRIVER}"

"""`gpuslice gpus`'s text (cli/gpu_table.py) for an inventory as NVML gives it."""

from __future__ import annotations

import pytest

from gpuslice.cli.gpu_table import render
from gpuslice.inventory import Gpu, Inventory

pytestmark = pytest.mark.unit


def test_the_table_names_the_numa_nodes_numa_bind_takes_gpus_from():
    gpus = tuple(Gpu(i, f"GPU-{i}", "NVIDIA H100", f"00000000:{i:02X}:00.0", 80 << 30, 0, 0) for i in range(4))
    topology = {(a, b): "system" for a in range(4) for b in range(4) if a != b}
    for a, b in ((0, 1), (2, 3)):
        topology[(a, b)] = topology[(b, a)] = "node"
    inv = Inventory("580.95.05", 13000, gpus, topology, {(1, 2): True, (2, 1): True})
    lines = render(inv).splitlines()
    assert lines[-1] == "NUMA nodes  0,1 | 2,3"  # NVLink across the sockets (1-2) makes no one node
    assert lines[-2].startswith("topology  0-1: node, 0-2: system")
    one = Inventory("580.95.05", 13000, gpus[:1], {})
    assert not any(line.startswith("NUMA nodes") for line in render(one).splitlines())

"""nvidia-smi-like text for an Inventory."""

from __future__ import annotations

from gpuslice.inventory import Inventory
from gpuslice.units import format_bytes


def render(inv: Inventory) -> str:
    lines = [f"driver {inv.driver_version}   CUDA {inv.cuda_version // 1000}.{inv.cuda_version % 1000 // 10}"]
    lines.append(f"{'GPU':>3}  {'name':<36} {'bus id':<17} {'memory used / total':>24} {'util':>5}  procs")
    for g in inv.gpus:
        mem = f"{format_bytes(g.memory_used)} / {format_bytes(g.memory_total)}"
        lines.append(
            f"{g.index:>3}  {g.name[:36]:<36} {g.pci_bus_id:<17} {mem:>24} {g.utilization:>4}%  {len(g.processes)}"
        )
        lines.extend(f"{'':>5}pid {p.pid:<8} {format_bytes(p.used_bytes):>10}" for p in g.processes)
    if inv.topology:
        pairs = ", ".join(f"{a}-{b}: {lvl}" for (a, b), lvl in sorted(inv.topology.items()) if a < b)
        lines.append(f"topology  {pairs}")
        # what gpuslice.io/numa-bind takes a slice's GPUs from (a group each)
        lines.append(f"NUMA nodes  {' | '.join(','.join(map(str, grp)) for grp in inv.numa_groups())}")
    return "\n".join(lines)

"""`gpuslice status` as text: GPUs with what slices hold, then the slices."""

from __future__ import annotations

from gpuslice.proto import gpuslice_pb2 as pb
from gpuslice.units import format_bytes


def _driver_limits(inv: pb.InventoryReply) -> list[str]:
    """One line for the driver's memory limits: the same answer for every GPU, or each GPU's."""
    states = {g.index: g.driver_limits for g in inv.gpus if g.driver_limits}
    if not states:
        return []
    if len(set(states.values())) == 1:
        return [f"driver memory limits: {next(iter(states.values()))}"]
    return ["driver memory limits: " + "; ".join(f"GPU {i} {s}" for i, s in sorted(states.items()))]


def render_status(inv: pb.InventoryReply, slices: list[pb.Slice]) -> str:
    lines = [f"{'GPU':>3}  {'uuid':<40} {'reserved / total':>24} {'cores':>5} {'slices':>6}"]
    for g in inv.gpus:
        held = f"{format_bytes(g.memory_reserved)} / {format_bytes(g.memory_total)}"
        cores = "whole" if g.exclusive else str(g.cores_reserved)
        lines.append(f"{g.index:>3}  {g.uuid:<40} {held:>24} {cores:>5} {g.slices:>6}")
    lines += _driver_limits(inv)
    lines.append("")
    if not slices:
        lines.append("no slices")
        return "\n".join(lines)
    lines.append(
        f"{'container':<24} {'slice':<16} {'state':<8} {'GPU':>4} {'limit':>10} {'used':>10} {'cores':>5} "
        f"{'GPU use':>7}  policy"
    )
    for s in slices:
        for i, sg in enumerate(s.gpus):
            used = format_bytes(s.memory_used) if i == 0 else ""
            use = f"{100 * sg.compute_used:.0f}%" if sg.compute_target else "-"
            use = f"{use} fit" if sg.compute_fitting else use  # its share is not held yet (docs/compute.md)
            lines.append(
                f"{s.container_id[:24]:<24} {s.id:<16} {s.state:<8} {sg.index:>4} {format_bytes(sg.memory_limit):>10} "
                f"{used:>10} {sg.cores:>5} {use:>7}  {s.policy:<8} {s.enforcement}"
            )
            if sg.driver_side and (i == 0 or sg.index != s.gpus[i - 1].index):
                lines.append(_driver_side(s, sg))
    return "\n".join(lines)


def _driver_side(s: pb.Slice, sg: pb.SliceGpu) -> str:
    """What the driver holds for the slice's processes on a GPU beyond their charges (part of used)."""
    line = f"{'':<24} {'':<16} {'':<8} {sg.index:>4} driver-side {format_bytes(sg.driver_side)} (in used)"
    limit = sum(x.memory_limit for x in s.gpus if x.index == sg.index)
    if len({x.index for x in s.gpus}) == 1 and s.memory_used > limit:
        line += f"; {format_bytes(s.memory_used - limit)} past the limit: its allocations are refused"
    return line

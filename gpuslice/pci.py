"""A GPU's place on the host's PCI bus, read from sysfs: its bus ID as the
kernel writes it, and the NUMA node the kernel says the device is attached
to (`/sys/bus/pci/devices/<bus ID>/numa_node`; -1 where the firmware gives
none, as on one-socket machines)."""

from __future__ import annotations

import re
from pathlib import Path

MAX_READ = 32  # numa_node holds a small integer and a newline


def bus_id(nvml_bus_id: str) -> str | None:
    """NVML's bus ID ("00000000:3B:00.0") in the kernel's form ("0000:3b:00.0")."""
    m = re.fullmatch(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])", nvml_bus_id.strip())
    if not m:
        return None
    domain, bus, device, function = m.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}.{function}"


def numa_node(nvml_bus_id: str, sysfs: Path) -> int | None:
    """The NUMA node the device is attached to; None where sysfs has no device of that bus ID,
    or names no node."""
    bus = bus_id(nvml_bus_id)
    if bus is None:
        return None
    try:
        with open(sysfs / "bus" / "pci" / "devices" / bus / "numa_node", "rb") as f:
            text = f.read(MAX_READ).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if re.fullmatch(r"[0-9]{1,4}", text) else None

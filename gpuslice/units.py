"""Byte sizes as people write them ("4Gi", "1500Mi") and as we print them."""

from __future__ import annotations

import re

_BINARY = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
_DECIMAL = {"k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_SIZE = re.compile(r"^\s*(\d+)\s*(Ki|Mi|Gi|Ti|k|K|M|G|T)?(B)?\s*$")


def parse_bytes(text: str) -> int:
    """Parse "4Gi", "1500Mi", "2G", "1048576" (bytes).  Raises ValueError with
    what is accepted."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f'"{text}" is not a size; use bytes or a unit: Ki, Mi, Gi, Ti (binary) or K, M, G, T')
    unit = m.group(2) or ""
    return int(m.group(1)) * (_BINARY.get(unit) or _DECIMAL[unit])


def format_bytes(n: int) -> str:
    """1073741824 -> "1.0 GiB"; exact bytes below 1 KiB."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"

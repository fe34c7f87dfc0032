"""Byte sizes as people write them ("4Gi", "1500Mi") and as we print them."""

from __future__ import annotations

import re

_BINARY = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
_DECIMAL = {"k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
# ASCII only: Python's \d and int() also take other scripts' digits (fullwidth "16")
_SIZE = re.compile(r"^[ \t]*([0-9]{1,19})[ \t]*(Ki|Mi|Gi|Ti|k|K|M|G|T)?(B)?[ \t]*\Z", re.ASCII)
MAX_BYTES = 1 << 50  # 1 PiB: far above any GPU's memory, and exact in a float


def parse_bytes(text: str) -> int:
    """Parse "4Gi", "1500Mi", "2G", "1048576" (bytes), at most MAX_BYTES.
    Raises ValueError with what is accepted."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f'"{text[:64]}" is not a size; use bytes or a unit: Ki, Mi, Gi, Ti (binary) or K, M, G, T')
    unit = m.group(2) or ""
    n = int(m.group(1)) * (_BINARY.get(unit) or _DECIMAL[unit])
    if n > MAX_BYTES:
        raise ValueError(f'"{text[:64]}" is more than {MAX_BYTES >> 50} PiB')
    return n


def format_bytes(n: int) -> str:
    """1073741824 -> "1.0 GiB"; exact bytes below 1 KiB."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"

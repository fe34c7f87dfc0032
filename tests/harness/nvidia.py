"""NVIDIA's official headers for the tests (PyPI nvidia-cuda-runtime,
nvidia-nvml-dev), and the simulator's table of driver API symbols."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.harness import REPO
from tools.nvidia_headers import include_dir

DEF = REPO / "libcuda_wrap/symbols/sim_driver_api.def"
SIM_DRIVER_VERSION = 13000


def needs(header: str) -> Path:
    d = include_dir(header)
    if d is None:
        pytest.skip(f"NVIDIA's {header} is not installed (pip install nvidia-cuda-runtime nvidia-nvml-dev)")
    return d


def def_entries() -> list[tuple[str, int, str, str]]:
    pat = re.compile(r"^SYM\((\w+), (\d+), (DEFAULT|PTDS), (\w+)\)$", re.M)
    entries = [(n, int(v), k, s) for n, v, k, s in pat.findall(DEF.read_text())]
    assert len(entries) >= 100, f"{DEF}: {len(entries)} SYM entries read; the pattern no longer matches the file"
    return entries

"""Where gpuslice's files live: the built native libraries and node paths."""

from __future__ import annotations

import os
from pathlib import Path

#: packages install the libraries outside site-packages and point here
NATIVE_DIR_ENV = "GPUSLICE_NATIVE_DIR"


def native_dir() -> Path:
    """Directory holding the built C parts (``sim/``, later ``wrap/``)."""
    override = os.environ.get(NATIVE_DIR_ENV)
    if override:
        return Path(override)
    return Path(__file__).resolve().parent / "_native"


def sim_lib_dir() -> Path:
    """Directory with the simulator's libcuda.so.1 and libnvidia-ml.so.1."""
    return native_dir() / "sim"

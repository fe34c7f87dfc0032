"""Where gpuslice's files live: the built native libraries and node paths."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

#: packages install the libraries outside site-packages and point here
NATIVE_DIR_ENV = "GPUSLICE_NATIVE_DIR"


def native_dir() -> Path:
    """Directory holding the node's built C parts (``wrap/``, ``ledger/``, ``tools/``, ``bin/``)."""
    override = os.environ.get(NATIVE_DIR_ENV)
    if override:
        return Path(override)
    return Path(__file__).resolve().parent / "_native"


def built_executable(name: str) -> Path:
    """gpuslice-hook or gpuslice-runtime as built with the C parts."""
    return native_dir() / "bin" / name


def executable(name: str) -> Path:
    """gpuslice-hook or gpuslice-runtime: the installed one on PATH (packages put
    them in /usr/bin), else the one built with the C parts."""
    found = shutil.which(name)
    return Path(found) if found else built_executable(name)

"""The runtime shim (runtime_shim/gpuslice_runtime.c) run in front of a
stand-in runtime that records its argv and exits 7."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gpuslice.paths import built_executable

SHIM = built_executable("gpuslice-runtime")


def fake_runtime(tmp: Path) -> Path:
    rt = tmp / "fake-runc"
    rt.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp}/argv\nexit 7\n')
    rt.chmod(0o755)
    return rt


def run_shim(
    tmp: Path, *argv: str, socket: Path | None = None, spec: Path | None = None
) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "GPUSLICE_RUNTIME": str(fake_runtime(tmp)),
        "GPUSLICE_SOCKET": str(socket or tmp / "none.sock"),
        "GPUSLICE_CDI_SPEC": str(spec or ""),
    }
    return subprocess.run([str(SHIM), *argv], capture_output=True, text=True, env=env)

"""A minimal container root filesystem for the demo and the end-to-end tests:
busybox, the CUDA probe and load generator, and the shared libraries they and
the driver libraries need (no image registry is needed)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from gpuslice.paths import native_dir

PROBE = "/usr/bin/gpuslice-cuda-probe"
LOAD = "/usr/bin/gpuslice-cuda-load"


def _deps(binary: Path) -> set[Path]:
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
    found = set()
    for line in out.splitlines():
        m = re.search(r"(/\S+) \(0x", line)
        if m:
            found.add(Path(m.group(1)))
    return found


def build(root: Path) -> Path:
    (root / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2("/bin/busybox", root / "bin" / "busybox")
    for cmd in ("sh", "cat", "echo", "sleep", "ls", "true"):
        (root / "bin" / cmd).unlink(missing_ok=True)
        (root / "bin" / cmd).symlink_to("busybox")
    (root / "usr/bin").mkdir(parents=True, exist_ok=True)
    libs: set[Path] = set()
    for tool in (PROBE, LOAD):
        built = native_dir() / "tools" / Path(tool).name
        shutil.copy2(built, root / tool.lstrip("/"))
        libs |= _deps(built)
    for lib in ("wrap/libcuda.so.1", "wrap/libnvidia-ml.so.1", "sim/libcuda.so.1", "sim/libnvidia-ml.so.1"):
        libs |= _deps(native_dir() / lib)
    for dep in libs:
        target = root / str(dep).lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(dep.resolve(), target)
    for d in ("proc", "sys", "dev", "tmp", "etc", "run"):
        (root / d).mkdir(exist_ok=True)
    return root

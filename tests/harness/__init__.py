"""The test and benchmark harness: processes standing for containers (their
own pid namespace) and the environment that puts the interposer in front of
the simulator, attached to a daemon started by gpuslice.cli.sim_daemon."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from gpuslice.cli.sim_daemon import RunningDaemon
from gpuslice.paths import native_dir
from gpuslice.pid_namespace import PidNamespace

REPO = Path(__file__).resolve().parents[2]
CLIENTS = REPO / "tests" / "clients"
__all__ = ["PidNamespace"]  # tests and benchmarks take it from here


def interposer_env(d: RunningDaemon) -> dict[str, str]:
    """The environment that puts the interposer in front of the simulator,
    attached to the daemon's slices."""
    return {
        **os.environ,
        "LD_LIBRARY_PATH": str(native_dir() / "wrap"),
        "GPUSLICE_REAL_LIBCUDA": str(native_dir() / "sim" / "libcuda.so.1"),
        "GPUSLICE_REAL_LIBNVML": str(native_dir() / "sim" / "libnvidia-ml.so.1"),
        "GPUSLICE_SLICE_SOCKET": str(d.slice_socket),
        "GPUSLICE_SIM_CONFIG": str(d.dir / "sim.yaml"),
        "GPUSLICE_SIM_STATE_DIR": str(d.dir / "sim"),
    }


def wait_until_ready(proc: subprocess.Popen, log: Path, ready, name: str, seconds: float) -> None:  # type: ignore[no-untyped-def]
    """Wait for a service we started (containerd, dockerd) to answer `ready()`;
    its log's tail in the error when it exits or never answers."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited {proc.returncode}: {log.read_text()[-2000:]}")
        if ready():
            return
        time.sleep(0.2)
    raise RuntimeError(f"{name} did not answer in {seconds} s: {log.read_text()[-2000:]}")


def build_package(kind: str, out: Path) -> Path:
    """`packaging/build.py KIND OUT` (deb, rpm, image): the file it made."""
    r = subprocess.run([sys.executable, str(REPO / "packaging/build.py"), kind, str(out)], capture_output=True,
                       text=True, timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return Path(r.stdout.strip().splitlines()[-1])

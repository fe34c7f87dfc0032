"""The test and benchmark harness: processes standing for containers (their
own pid namespace) and the environment that puts the interposer in front of
the simulator, attached to a daemon started by gpuslice.cli.sim_daemon."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from gpuslice.cli.sim_daemon import RunningDaemon
from gpuslice.paths import native_dir

REPO = Path(__file__).resolve().parents[2]
SHARED_REFERENCE = REPO.parent / "shared" / "reference"  # official schemas and protos, read at test time
CLIENTS = REPO / "tests" / "clients"


class PidNamespace:
    """A process in a new pid namespace, standing for a container's init (root only)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "sleep", "600"])
        deadline = time.monotonic() + 5
        self.init_pid = 0
        while not self.init_pid and time.monotonic() < deadline:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
            self.init_pid = int(children[0]) if children else 0
            time.sleep(0.02)
        if not self.init_pid:
            self.proc.kill()
            raise RuntimeError("unshare did not start its child")

    def command(self, argv: list[str]) -> list[str]:
        """argv run inside this pid namespace."""
        return ["nsenter", "--target", str(self.init_pid), "--pid", "--", *argv]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


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

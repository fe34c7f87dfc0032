"""A node for real containers on the simulated GPU: a daemon with its CDI
spec installed and the runtime shim configured, and Podman run as the tests
run it (with the CDI device and the hook, or with the shim)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from gpuslice.cdi import spec as cdi_spec
from gpuslice.cdi.registry import Registry as CdiRegistry
from gpuslice.cli import sim_daemon
from gpuslice.cli.container_demo import PODMAN
from gpuslice.paths import built_executable
from tests.harness.machine import gpu

__all__ = ["PODMAN"]

SPEC_PATH = Path("/var/run/cdi/gpuslice-e2e.json")
SHIM = built_executable("gpuslice-runtime")
MiB, GiB = 1 << 20, 1 << 30

needs_runtimes = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("podman", "runc", "ctr", "containerd")),
    reason="needs root, podman, runc and containerd (./dev.sh installs them as root)",
)


class Node:
    """A daemon on the simulator, its CDI spec installed, the shim configured."""

    def __init__(self, daemon, tmp: Path, gpus: list[dict] | None = None) -> None:
        others = [p for p, _, _ in CdiRegistry().specs() if p != SPEC_PATH]
        assert not others, f"another {cdi_spec.KIND} spec is installed: {others}"
        self.d = daemon(gpus or [gpu("16Gi")], sweep_interval=0.5)
        self.client = self.d.client()
        r = sim_daemon.cdi_generate(self.d, SPEC_PATH)
        assert r.returncode == 0, r.stderr
        self.shim = sim_daemon.shim_for(self.d, SPEC_PATH, tmp / "gpuslice-runtime", SHIM)

    def wait_empty(self, seconds: float = 5) -> list:
        deadline = time.monotonic() + seconds
        while self.client.list() and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.client.list()


def podman(args: list[str], root: Path, cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["podman", "run", "--rm", *PODMAN, *args, "--rootfs", str(root), *cmd],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def podman_detached(name: str, root: Path, seconds: int) -> None:
    """A container holding a 1 GiB slice of GPU 0 (CDI), sleeping in the background."""
    r = subprocess.run(
        ["podman", "run", "-d", "--name", name, *PODMAN, "--device", "gpuslice.io/gpu=0",
         "--annotation", "gpuslice.io/memory=1Gi", "--rootfs", str(root), "/bin/sleep", str(seconds)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr


def probe_result(r: subprocess.CompletedProcess) -> dict:
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])

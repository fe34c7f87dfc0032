"""The test harness: where the repository and the client programs are, and
what several harness modules share. Its modules: machine (simulated
machines, agents, containers, daemons), interposer, slice_socket, shim,
nvidia (NVIDIA's headers), references (the official contracts), debian,
containerd, docker, podman_node, gpu_node, dra, api_server, kubelet_api,
oci_image. Test helpers live here; conftest.py keeps the fixtures."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from gpuslice.cli.pid_namespace import PidNamespace
from gpuslice.cli.sim_daemon import interposer_env

REPO = Path(__file__).resolve().parents[2]
CLIENTS = REPO / "tests" / "clients"
__all__ = ["PidNamespace", "interposer_env"]  # tests take them from here


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


_BUILT: dict[str, Path] = {}  # kind -> what this session built of it (the tree does not change under a run)


def package_argv(kind: str, out: Path) -> list[str]:
    """`packaging/build.py KIND OUT`: it prints the file it made last."""
    return [sys.executable, str(REPO / "packaging/build.py"), kind, str(out)]


def build_package(kind: str, out: Path) -> Path:
    """`packaging/build.py KIND OUT` (deb, rpm, sim-deb, sim-rpm, image): the file it made,
    built once a session (the .deb compiles the C parts: 24 s) and copied to each OUT."""
    if kind not in _BUILT or not _BUILT[kind].is_file():
        r = subprocess.run(package_argv(kind, out), capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        _BUILT[kind] = Path(r.stdout.strip().splitlines()[-1])
    built = _BUILT[kind]
    if built.parent != out:
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, out / built.name)
    return out / built.name

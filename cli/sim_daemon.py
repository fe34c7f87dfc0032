"""A node on the simulator: the allocator daemon run as a child process on a
simulated machine, for `gpuslice demo` (the tests and benchmarks build on it)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gpuslice import constants, simulator
from gpuslice.client import AllocatorClient
from gpuslice.paths import native_dir


@dataclass
class RunningDaemon:
    dir: Path
    config: Path
    proc: subprocess.Popen
    socket: Path
    slice_socket: Path
    metrics_port: int

    @property
    def slice_files_dir(self) -> Path:
        return self.dir / "slices"

    def client(self) -> AllocatorClient:
        return AllocatorClient(self.socket, timeout=10)

    def log(self) -> str:
        return (self.dir / "daemon.log").read_text()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        self.proc.send_signal(sig)
        self.proc.wait(20)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(d: Path, gpus: list[dict], topology: list | None = None, **overrides) -> Path:
    sim_cfg = d / "sim.yaml"
    sim_cfg.write_text(yaml.safe_dump({"gpus": gpus, **({"topology": topology} if topology else {})}))
    cfg = {
        "socket": str(d / "gpuslice.sock"),
        "slice_socket": str(d / "slice" / "slice.sock"),
        "state_dir": str(d / "state"),
        "slice_files_dir": str(d / "slices"),
        "metrics": {"port": 0},
        "nvml": "sim",
        "sim": {"config": str(sim_cfg), "state_dir": str(d / "sim")},
        "sweep_interval": 0.2,
        **overrides,
    }
    path = d / "daemon.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def start(d: Path, config: Path, python: str = sys.executable) -> RunningDaemon:
    cfg = yaml.safe_load(config.read_text())
    log = open(d / "daemon.log", "a")  # noqa: SIM115 - handed to the child
    verbose = ["--verbose"] if os.environ.get("GPUSLICE_DAEMON_VERBOSE") else []
    proc = subprocess.Popen(
        [python, "-m", "gpuslice.cli", "daemon", "--config", str(config), *verbose],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        cwd=d,  # not the caller's: `-m` looks in the working directory first (a source tree's gpuslice/)
    )
    sock = Path(cfg["socket"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited {proc.returncode}: {(d / 'daemon.log').read_text()}")
        if sock.exists():
            try:
                with grpc.insecure_channel(f"unix:{sock}") as ch:
                    reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    break
            except grpc.RpcError:
                pass
        time.sleep(0.05)
    else:
        proc.kill()
        raise RuntimeError("daemon did not become healthy in 30 s")
    return RunningDaemon(d, config, proc, sock, Path(cfg["slice_socket"]), cfg.get("metrics", {}).get("port", 0))


def cdi_generate(d: RunningDaemon, output: Path) -> subprocess.CompletedProcess:
    """`gpuslice cdi generate` for this daemon's simulated GPUs into `output`:
    the hook pointed at this daemon, the simulator's config and state mounted."""
    return subprocess.run(
        [sys.executable, "-m", "gpuslice.cli", "cdi", "generate", "--driver", "sim", "--output", str(output),
         "--daemon-socket", str(d.socket), "--slice-dir", str(d.slice_socket.parent),
         "--sim-config", str(d.dir / "sim.yaml"), "--sim-state-dir", str(d.dir / "sim")],
        capture_output=True, text=True, timeout=120, cwd=d.dir,
    )  # fmt: skip


def shim_for(d: RunningDaemon, spec: Path, path: Path, shim: Path) -> Path:
    """An executable at `path` that runs the runtime shim `shim` against this
    daemon and CDI spec (what a runtime's configuration names as its binary)."""
    path.write_text(
        f"#!/bin/sh\nexport {constants.ENV_SOCKET}={d.socket}\nexport {constants.ENV_CDI_SPEC}={spec}\n"
        f'exec {shim} "$@"\n'
    )
    path.chmod(0o755)
    return path


def interposer_env(d: RunningDaemon) -> dict[str, str]:
    """The environment that puts the interposer in front of the simulator,
    attached to the daemon's slices."""
    simulator.require()
    import gpuslice_sim

    return {
        **os.environ,
        "LD_LIBRARY_PATH": str(native_dir() / "wrap"),
        "GPUSLICE_REAL_LIBCUDA": str(gpuslice_sim.lib_dir() / "libcuda.so.1"),
        "GPUSLICE_REAL_LIBNVML": str(gpuslice_sim.lib_dir() / "libnvidia-ml.so.1"),
        "GPUSLICE_SLICE_SOCKET": str(d.slice_socket),
        "GPUSLICE_SIM_CONFIG": str(d.dir / "sim.yaml"),
        "GPUSLICE_SIM_STATE_DIR": str(d.dir / "sim"),
    }

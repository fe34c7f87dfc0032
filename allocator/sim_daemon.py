"""Run the allocator daemon on a simulated machine as a real process: for the
demo, the tests and the benchmarks."""

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
        "ledger_dir": str(d / "ledgers"),
        "metrics": {"port": 0},
        "nvml": "sim",
        "sim": {"config": str(sim_cfg), "state_dir": str(d / "sim")},
        "sweep_interval": 0.2,
        **overrides,
    }
    path = d / "daemon.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def start(d: Path, config: Path) -> RunningDaemon:
    cfg = yaml.safe_load(config.read_text())
    log = open(d / "daemon.log", "a")  # noqa: SIM115 - handed to the child
    verbose = ["--verbose"] if os.environ.get("GPUSLICE_DAEMON_VERBOSE") else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuslice.cli", "daemon", "--config", str(config), *verbose],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
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

"""The simulated machine as tests use it: a machine's config and state
(SimMachine), client processes that drive it through NVIDIA's own Python
clients (Agent), processes standing for containers (Container), OCI bundles
as a runtime hands them over, and daemons on the simulator (DaemonFactory).
conftest.py turns these into fixtures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpuslice.cli.pid_namespace import first_child
from tests.harness import CLIENTS, PidNamespace

AGENT = CLIENTS / "agent.py"
MiB = 1 << 20
GiB = 1 << 30
# the simulator's device-memory allocation paths, as the agent names them
DEVICE_PATHS = ["mem", "pitch", "managed", "async", "pool", "vmm", "array", "array3d", "mipmap"]


@dataclass
class SimMachine:
    config: Path
    state_dir: Path
    env: dict[str, str] = field(default_factory=dict)

    def python(self, code: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", code], env=self.env, capture_output=True, text=True, timeout=timeout
        )


class Agent:
    """One client process; call(op, **args) -> its JSON reply."""

    def __init__(self, env: dict[str, str], prefix: list[str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [*(prefix or []), sys.executable, str(AGENT)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

        # under nsenter the client is nsenter's child; its own getpid() is its namespace's number
        self.host_pid = first_child(self.proc.pid) if prefix else self.proc.pid

    @property
    def pid(self) -> int:
        return self.proc.pid

    def call(self, op: str, **args) -> dict:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"agent died: {self.proc.stderr.read() if self.proc.stderr else ''}")
        reply = json.loads(line)
        if "exception" in reply:
            raise RuntimeError(reply["exception"])
        return reply

    def kill(self) -> None:
        """SIGKILL the client itself (under nsenter, the process we started is its parent)."""
        os.kill(self.host_pid, signal.SIGKILL)
        self.proc.wait(10)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()  # type: ignore[union-attr]  # EOF ends the agent
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create pid namespaces (unshare)")


Container = PidNamespace  # a process in a new pid namespace, standing for a container's init


def oci_bundle(path: Path, annotations: dict[str, str], env: list[str] | None = None) -> Path:
    """An OCI bundle at `path`: an empty rootfs/ and a config.json with these
    annotations and process environment, as a runtime hands the hook or shim."""
    (path / "rootfs").mkdir(parents=True)
    config = {"ociVersion": "1.0.2", "root": {"path": "rootfs"}, "annotations": annotations,
              "process": {"args": ["sh"], "env": env or []}}  # fmt: skip
    (path / "config.json").write_text(json.dumps(config))
    return path


def gpu(memory: str = "16Gi", **extra) -> dict:
    return {"memory": memory, **extra}


class DaemonFactory:
    """daemon(gpus=[...], topology=[...], **config) -> a running daemon on the
    simulator; daemon.restart(d) starts it again on the same state."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.running: list = []

    def __call__(self, gpus: list[dict] | None = None, topology: list | None = None, **overrides):
        from gpuslice.cli import sim_daemon as daemon_fixture

        d = self.tmp_path / f"d{len(self.running)}"
        d.mkdir()
        config = daemon_fixture.write_config(d, gpus or [gpu("16Gi"), gpu("16Gi")], topology, **overrides)
        return self._track(daemon_fixture.start(d, config))

    def restart(self, rd):  # type: ignore[no-untyped-def]
        from gpuslice.cli import sim_daemon as daemon_fixture

        return self._track(daemon_fixture.start(rd.dir, rd.config))

    def _track(self, rd):  # type: ignore[no-untyped-def]
        self.running.append(rd)
        return rd

    def stop_all(self) -> None:
        for rd in self.running:
            if rd.proc.poll() is None:
                rd.proc.terminate()
                try:
                    rd.proc.wait(10)
                except subprocess.TimeoutExpired:
                    rd.proc.kill()

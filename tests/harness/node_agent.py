"""The node agent run against a simulated host (tests/harness/fake_host.py):
as a process, or from the built image with podman as the chart's DaemonSet
runs it (privileged, the host's pids, the host's root at /host and its
/run/gpuslice, /var/lib/gpuslice and /var/run/cdi mounted); and the checks
of what it installed, shared by both."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpuslice.client import AllocatorClient
from gpuslice.paths import built_executable, native_dir
from tests.harness import fake_host
from tests.harness.containerd import containerd_bin, cri_sections
from tests.harness.fake_host import FakeHost
from tests.harness.references import schema_validator

HOST_DIR = "/opt/gpuslice"
SERVING = "installed under"  # the agent's log line once it serves
STARTED_WITHIN_S = 90


@dataclass
class Dirs:
    """The host's directories the agent's pod mounts (here: per test, at the same paths)."""

    run: Path
    state: Path
    cdi: Path

    @classmethod
    def under(cls, work: Path) -> Dirs:
        d = cls(work / "run", work / "state", work / "cdi")
        for p in (d.run, d.state, d.cdi):
            p.mkdir(parents=True, exist_ok=True)
        return d


def agent_args(host_root: Path | str, dirs: Dirs, *extra: str, host_dir: str = HOST_DIR) -> list[str]:
    return ["node-agent", f"--host-root={host_root}", f"--host-dir={host_dir}", f"--run-dir={dirs.run}",
            f"--state-dir={dirs.state}", f"--cdi-dir={dirs.cdi}", "--metrics-port=0", "--driver-poll=0.3",
            "--runtime-restart=none", *extra]  # fmt: skip


@dataclass
class AgentRun:
    proc: subprocess.Popen
    dirs: Dirs
    log: Path
    # podman kill -s TERM NAME: podman 4.3's `stop` delivers nothing to a container in the
    # host's pid namespace (it waits out its timeout, then kills); else SIGTERM to the process
    stop_cmd: list[str] = field(default_factory=list)
    offset: int = 0  # where this run's lines start in the log

    @property
    def socket(self) -> Path:
        return self.dirs.run / "gpuslice.sock"

    @property
    def spec(self) -> dict:
        return json.loads((self.dirs.cdi / "gpuslice.json").read_text())

    def text(self) -> str:
        with self.log.open("rb") as f:
            f.seek(self.offset)
            return f.read().decode(errors="replace")

    def __post_init__(self) -> None:
        STARTED.append(self)

    def wait_serving(self) -> AgentRun:
        deadline = time.monotonic() + STARTED_WITHIN_S
        while SERVING not in self.text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the agent did not start (exit {self.proc.poll()}):\n{self.text()}")
            time.sleep(0.1)
        return self

    def client(self) -> AllocatorClient:
        return AllocatorClient(self.socket, timeout=10)

    def stop(self) -> int:
        """SIGTERM, as the kubelet sends it; the agent's exit status. One that does not end
        within 90 s is asked where its threads are (SIGUSR1), then killed, and that is the failure."""
        if self.proc.poll() is None:
            if self.stop_cmd:
                subprocess.run(self.stop_cmd, capture_output=True, timeout=90)
            else:
                self.proc.terminate()
        try:
            return self.proc.wait(90)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(2)
            self.proc.kill()
            self.proc.wait(30)
            raise AssertionError(f"the agent did not stop within 90 s of SIGTERM; its log:\n{self.text()}") from None


STARTED: list[AgentRun] = []


def stop_all() -> None:
    """Every agent a test started and left running (it failed half-way) stopped."""
    while STARTED:
        run = STARTED.pop()
        if run.proc.poll() is None:
            try:
                run.stop()
            except AssertionError:  # it did not stop, and was killed: the test that left it says so
                pass
            except subprocess.TimeoutExpired:  # its stop command did not end
                run.proc.kill()
                run.proc.wait(30)


def start_process(host: FakeHost, work: Path, *extra: str) -> AgentRun:
    """The agent as a plain process (what the image runs, without the image)."""
    dirs = Dirs.under(work)
    log = work / "agent.log"
    offset = log.stat().st_size if log.exists() else 0
    proc = subprocess.Popen([sys.executable, "-m", "gpuslice.cli", *agent_args(host.root, dirs, *extra)],
                            stdout=log.open("ab"), stderr=subprocess.STDOUT,
                            env={**os.environ, **host.env(), "PYTHONUNBUFFERED": "1"})  # fmt: skip
    return AgentRun(proc, dirs, log, offset=offset)


def podman_command(image: str, name: str, host_root: Path, dirs: Dirs, env: dict[str, str], mounts: list[Path],
                   *extra: str, host_dir: str = HOST_DIR) -> list[str]:  # fmt: skip
    """The DaemonSet's pod, in podman's words."""
    cmd = ["podman", "--runtime", "runc", "run", "--rm", "--name", name, "--privileged", "--pid", "host",
           "--network", "host", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
           "-v", f"{host_root}:/host:rslave"]  # fmt: skip
    for p in (dirs.run, dirs.state, dirs.cdi, *mounts):
        cmd += ["-v", f"{p}:{p}"]
    for k, v in env.items():
        cmd += ["-e", f"{k}={v}"]
    return [*cmd, image, *agent_args("/host", dirs, *extra, host_dir=host_dir)]


def start_image(image: str, name: str, host: FakeHost, work: Path, *extra: str) -> AgentRun:
    dirs = Dirs.under(work)
    log = work / f"{name}.log"
    offset = log.stat().st_size if log.exists() else 0
    cmd = podman_command(image, name, host.root, dirs, host.env(), [host.sim_config.parent], *extra)
    proc = subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT)
    return AgentRun(proc, dirs, log, ["podman", "kill", "--signal", "TERM", name], offset)


# ---- what an installed node holds ------------------------------------------------


def parts_built() -> dict[str, bytes]:
    found = {f"bin/{n}": built_executable(n).read_bytes() for n in ("gpuslice-hook", "gpuslice-runtime")}
    found.update({f"wrap/{n}": (native_dir() / "wrap" / n).read_bytes() for n in ("libcuda.so.1", "libnvidia-ml.so.1")})
    return found


def mounts_of(spec: dict) -> dict[str, str]:
    """containerPath -> hostPath of the spec's common edits."""
    return {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}


def wait_for(what, seconds: float = 15.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not (got := what()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return got


def config_dump(host: fake_host.FakeHost) -> dict:
    r = subprocess.run([str(containerd_bin(host.version) / "containerd"), "--config", str(host.containerd_config),
                        "config", "dump"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return cri_sections(r.stdout)[0]


def check_installed(host: fake_host.FakeHost, spec: dict, parts: dict[str, bytes] | None) -> None:
    """The parts under HOST_DIR, the spec naming host paths, containerd's merged config."""
    base = host.root / HOST_DIR.lstrip("/")
    for rel in ("bin/gpuslice-hook", "bin/gpuslice-runtime", "wrap/libcuda.so.1", "wrap/libnvidia-ml.so.1"):
        assert (base / rel).stat().st_mode & 0o777 == 0o755, rel
        assert (base / rel).read_bytes()[:4] == b"\x7fELF"
        if parts is not None:
            assert (base / rel).read_bytes() == parts[rel], rel
    schema_validator("cdi", "schema.json").validate(spec)
    lib = f"/{fake_host.LIBDIR}"
    assert mounts_of(spec) == {
        # the links followed on the host: the absolute one under the host's root, not the agent's
        "/usr/lib/gpuslice/driver/libcuda.so.1": f"{lib}/libcuda.so.{fake_host.DRIVER_VERSION}",
        "/usr/lib/gpuslice/driver/libnvidia-ml.so.1": f"{lib}/libnvidia-ml.so.{fake_host.DRIVER_VERSION}",
        "/usr/lib/gpuslice/driver/libyaml-0.so.2": f"{lib}/libyaml-0.so.2",  # what the driver needs, beside it
        # a compute library of the driver's, its soname link followed on the host
        "/usr/lib/gpuslice/driver/libnvidia-ptxjitcompiler.so.1": f"{lib}/libnvidia-ptxjitcompiler.so."
        f"{fake_host.DRIVER_VERSION}",
        "/usr/lib/gpuslice/wrap/libcuda.so.1": f"{HOST_DIR}/wrap/libcuda.so.1",
        "/usr/lib/gpuslice/wrap/libnvidia-ml.so.1": f"{HOST_DIR}/wrap/libnvidia-ml.so.1",
        "/run/gpuslice/slice": mounts_of(spec)["/run/gpuslice/slice"],
    }
    hooks = spec["containerEdits"]["hooks"]
    assert {h["path"] for h in hooks} == {f"{HOST_DIR}/bin/gpuslice-hook"}
    assert all("deviceNodes" not in d["containerEdits"] for d in spec["devices"])  # the host has no /dev/nvidia0
    cri = config_dump(host)
    ours = cri["containerd"]["runtimes"]["gpuslice"]
    assert ours["options"]["BinaryName"] == f"{HOST_DIR}/bin/gpuslice-runtime"
    assert cri["containerd"]["runtimes"]["runc"]["runtime_type"] == "io.containerd.runc.v2"
    if host.version != "1.6":
        assert cri["enable_cdi"] is True

"""The kit's node: what one CUDA context costs on this driver (measured, then
charged per context by the daemon so that a slice's total is honest about
it), the daemon's config, the CDI spec from the driver's files, and the
daemon itself for the length of one call."""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kit_slices import DRIVER_MEMORY_PERIOD_S, PROBES, process_used

from gpuslice.cli import sim_daemon

MiB = 1 << 20
log = logging.getLogger("real-gpu")


class NodeError(RuntimeError):
    pass


@dataclass(frozen=True)
class NodePaths:
    work: Path  # sockets, the daemon's state, the CDI spec: short paths (sockets)
    sim: bool

    @property
    def config(self) -> Path:
        return self.work / "daemon.yaml"

    @property
    def socket(self) -> Path:
        return self.work / "gpuslice.sock"

    @property
    def spec(self) -> Path:
        return self.work / "cdi" / "gpuslice.json"

    @property
    def sim_config(self) -> Path:
        return self.work / "sim.yaml"

    @property
    def sim_state(self) -> Path:
        return self.work / "sim"


#: the simulated GPU the kit tries itself on: one context costs what a small real one does
SIM_CONFIG = "gpus:\n  - {memory: 16Gi, context_memory: 300Mi}\n"


def context_cost(gpu_uuid: str, timeout: float = 120) -> int:
    """Bytes the driver counts for a process with one context and 2 MiB, less
    the 2 MiB: run on the driver directly (no slice, no interposer)."""
    argv = [sys.executable, str(PROBES / "cuda_driver.py"), "context"]
    pipe = subprocess.PIPE
    proc = subprocess.Popen(argv, cwd=str(PROBES), stdin=pipe, stdout=pipe, stderr=pipe, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()  # the probe holds after one line; bounded by the kill below
        said = json.loads(line) if line.strip() else {"error": (proc.stderr.read() if proc.stderr else "")[-300:]}
        if "error" in said:
            raise NodeError(f"a bare context did not start: {said['error']}")
        used = process_used(gpu_uuid, proc.pid)
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    if used is None:
        raise NodeError("NVML does not give this driver's per-process memory")
    if used == 0:
        log.warning("NVML does not list the process that made a context: no reserve (the accounting rows say more)")
    return max(0, used - 2 * MiB)


def write_config(paths: NodePaths, context_reserve: int, settings: tuple[str, ...] = ()) -> None:
    """The daemon's config for this call; `settings`: more of it, as `key: value` lines (the
    kit's --daemon), which the daemon checks against its schema when it starts."""
    lines = [
        f"socket: {paths.socket}",
        f"slice_socket: {paths.work}/slice/slice.sock",
        f"state_dir: {paths.work}/state",
        f"slice_files_dir: {paths.work}/slices",
        "metrics: {port: 0}",
        f"context_reserve: {context_reserve}",
        f"driver_memory_period: {DRIVER_MEMORY_PERIOD_S}",  # what the driver holds itself, charged this often
    ]
    if paths.sim:
        lines += ["nvml: sim", f"sim: {{config: {paths.sim_config}, state_dir: {paths.sim_state}}}"]
    else:
        lines.append("nvml: driver")
    paths.config.write_text("\n".join([*lines, *settings]) + "\n")


def generate_spec(paths: NodePaths, gpuslice: Path, hook: Path, log: Path) -> None:
    argv = [str(gpuslice), "cdi", "generate", "--driver", "sim" if paths.sim else "nvidia",
            "--output", str(paths.spec), "--hook", str(hook), "--daemon-socket", str(paths.socket),
            "--slice-dir", f"{paths.work}/slice"]  # fmt: skip
    if paths.sim:
        argv += ["--sim-config", str(paths.sim_config), "--sim-state-dir", str(paths.sim_state)]
    with log.open("a") as out:
        r = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=120)
    if r.returncode:
        raise NodeError(f"gpuslice cdi generate failed (exit {r.returncode}; {log.name})")


class Daemon:
    """The daemon on this node's driver for the length of one call, started as
    the tests start theirs (`sim_daemon.start`: healthy before it returns). It
    runs in the call's session: a call the device tool cuts takes it along."""

    def __init__(self, paths: NodePaths, log: Path) -> None:
        self.paths = paths
        self.log = log
        self.started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        _stop_earlier(paths.work / "daemon.pid")
        shutil.rmtree(paths.work / "state", ignore_errors=True)  # no slices left from a cut call
        paths.socket.unlink(missing_ok=True)
        (paths.work / "daemon.log").unlink(missing_ok=True)
        # how the controller splits the GPU's time, reading by reading, and each change of what the
        # driver holds beyond a slice's charges (with the counts it came from) go into daemon.log
        os.environ.setdefault("GPUSLICE_DEBUG", "gpuslice.allocator.cost_split,gpuslice.allocator.compute.ticks,"
                              "gpuslice.allocator.driver_memory")  # fmt: skip
        try:
            self.running = sim_daemon.start(paths.work, paths.config)
        except RuntimeError as e:
            self._keep_log()
            raise NodeError(f"the daemon did not start: {str(e).splitlines()[0]} ({log.name})") from None
        (paths.work / "daemon.pid").write_text(str(self.running.proc.pid))

    def stop(self) -> None:
        if self.running.proc.poll() is None:
            try:
                self.running.kill(signal.SIGTERM)
            except subprocess.TimeoutExpired:
                self.running.kill()
        (self.paths.work / "daemon.pid").unlink(missing_ok=True)
        self._keep_log()

    def _keep_log(self) -> None:
        """Add this call's daemon log to the one in the reports: calls chained in one device
        command share $OUT, and the first call's fits are as much wanted as the last's."""
        with contextlib.suppress(OSError), self.log.open("ab") as out:
            out.write(f"==== gpuslice-kit: the daemon of the call started {self.started} ====\n".encode())
            out.write((self.paths.work / "daemon.log").read_bytes())


class LogLines:
    """The daemon log's lines since the last look: a step keeps those its time added."""

    def __init__(self, path: Path, at_end: bool = False) -> None:
        """`at_end`: from what the log holds now on (a step that reads what its own time added)."""
        self.path = path
        self.offset = 0
        if at_end:
            with contextlib.suppress(OSError):
                self.offset = path.stat().st_size

    def new(self, *markers: str) -> list[str]:
        """The whole lines added since the last look that hold any of `markers`."""
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        data = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next look
        self.offset += len(data)
        return [line for line in data.decode(errors="replace").splitlines() if any(m in line for m in markers)]


def _stop_earlier(pidfile: Path) -> None:
    """A daemon an earlier call left (a machine kept warm, a call killed before it stopped it)."""
    try:
        pid = int(pidfile.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return
    if b"daemon" not in cmdline:
        return  # the pid is another process's now
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return  # it stopped meanwhile
    deadline = time.monotonic() + 15
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)

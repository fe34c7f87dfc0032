"""Probes in slices: a probe (probes/*.py) runs in a temporary slice's pid
namespace with the CDI layout's environment, as `gpuslice selftest` runs its
worker; at each of its holds the kit samples what the daemon charges the slice
and what the driver counts for the process (NVML, read outside the slice)."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pynvml

from gpuslice.cli.selftest_slices import Box, WorkerError, worker_pid
from gpuslice.client import AllocatorClient
from gpuslice.paths import native_dir

DRIVER_MEMORY_PERIOD_S = 0.2  # the kit's daemon charges what the driver holds itself this often

PROBES = Path(__file__).resolve().parent / "probes"
RECLAIM_S = 1.0  # the selftest's figure: a dead process's memory is back within a second
STDERR_LINES = 400  # kept of a probe's stderr: frameworks log much; the tail and the stacks say why
Gate = Callable[[], dict]  # the probe's slice's launch gate as it is now (tokens, waits, next refill)


class ProbeError(RuntimeError):
    def __init__(self, message: str, overrun: str = "") -> None:
        super().__init__(message)
        self.overrun = overrun  # a probe that did not answer: its stacks and its slice's gate, for the report


@dataclass
class Sample:
    """The slice at one of the probe's holds."""

    tag: str
    said: dict  # what the probe said with the hold
    charge: int  # the daemon's charge for the slice
    nvml_used: int | None  # the driver's count for the probe's process (None: NVML does not say)


@dataclass
class Outcome:
    result: dict
    samples: dict[str, Sample] = field(default_factory=dict)
    exit_charge: int = -1  # the slice's charge once the process is gone
    exit_reclaim_s: float = -1.0


def process_used(gpu_uuid: str, pid: int) -> int | None:
    """What the driver counts on this GPU for the host pid (None when it does not say)."""
    handle = pynvml.nvmlDeviceGetHandleByUUID(gpu_uuid.encode())
    try:
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except pynvml.NVMLError:
        return None
    for p in procs:
        if p.pid == pid:
            used = p.usedGpuMemory
            return None if used is None or used >= (1 << 63) else int(used)  # NVML_VALUE_NOT_AVAILABLE
    return 0


def without_interposer(env: dict[str, str]) -> dict[str, str]:
    """The layout's environment with the interposer's directory left off the
    library path: the loader then finds the driver's libcuda (the cost runs)."""
    wrap = (native_dir() / "wrap" / "libcuda.so.1").resolve()
    keep = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d and (Path(d) / "libcuda.so.1").resolve() != wrap]
    return {**env, "LD_LIBRARY_PATH": ":".join(keep)}


class Probe:
    """One probe process in a box; its JSON lines read by a thread, so every wait is bounded."""

    def __init__(
        self, box: Box, script: str, args: list[str], env: dict[str, str], timeout: float, gate: Gate | None = None
    ) -> None:
        self.box = box
        self.timeout = timeout
        self.gate = gate
        argv = box.ns.command([sys.executable, str(PROBES / script), *args])
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd=str(PROBES))  # fmt: skip
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.errors: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._drain, daemon=True).start()
        try:
            self.pid = worker_pid(self.proc)  # type: ignore[arg-type]
        except WorkerError:
            self.proc.kill()
            self.proc.wait(10)
            time.sleep(0.1)  # the drain thread's last lines
            raise ProbeError(f"{script} did not start: {self.last_error()}") from None

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.errors.append(line)
            del self.errors[:-STDERR_LINES]

    def last_error(self) -> str:
        tail = "".join(self.errors).strip().splitlines()
        return tail[-1][:300] if tail else "no output"

    def message(self, deadline: float) -> dict:
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise ProbeError(f"no answer within {self.timeout:g} s", self.overrun()) from None
            if line is None:
                raise ProbeError(f"exited {self.proc.wait(10)}: {self.last_error()}")
            try:
                msg = json.loads(line)
            except ValueError:
                continue  # a framework's own print on stdout
            if "error" in msg:
                raise ProbeError(msg["error"][:300])
            return dict(msg)

    def overrun(self) -> str:
        """What a probe that does not answer is doing: its native and Python stacks (py-spy), the
        Python stacks faulthandler prints on SIGUSR1 (probes/common.py), its slice's launch gate."""
        parts = [f"pid {self.pid} (host), {self.box.name}"]
        if self.gate:
            try:
                parts.append(f"launch gate: {json.dumps(self.gate())}")
            except Exception as e:  # the record is a help, never a second failure
                parts.append(f"launch gate: unreadable ({type(e).__name__}: {e})")
        spy = shutil.which("py-spy", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
        if spy:
            try:
                r = subprocess.run(
                    [spy, "dump", "--native", "--pid", str(self.pid)], capture_output=True, text=True, timeout=60
                )
                parts.append("py-spy dump --native:\n" + (r.stdout + r.stderr).strip())
            except subprocess.TimeoutExpired:
                parts.append("py-spy dump --native: no answer within 60 s")
        else:
            parts.append("py-spy: not installed (the Python stacks below only)")
        seen = len(self.errors)
        with_stacks = _signal(self.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 3
        while with_stacks and time.monotonic() < deadline and not any("File " in ln for ln in self.errors[seen:]):
            time.sleep(0.05)
        time.sleep(0.2)  # the rest of the dump
        parts.append("stderr's tail (with faulthandler's stacks):\n" + "".join(self.errors[-80:]).rstrip())
        return "\n\n".join(parts)

    def answer(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            _signal(self.pid, signal.SIGKILL)  # the worker may be gone before its namespace's wrapper
            self.proc.kill()
        self.proc.wait(10)


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except OSError:
        return False


def run_probe(
    client: AllocatorClient,
    box: Box,
    gpu_uuid: str,
    script: str,
    args: list[str],
    env: dict[str, str],
    timeout: float,
    on_hold: Callable[[Probe, Sample], None] | None = None,
    reclaim: bool = True,
    gate: Gate | None = None,
) -> Outcome:
    """The probe to its result, sampling at each hold, then how fast the slice
    gets its memory back once the process is gone."""
    probe = Probe(box, script, args, env, timeout, gate)
    deadline = time.monotonic() + timeout
    samples: dict[str, Sample] = {}
    try:
        while True:
            msg = probe.message(deadline)
            if "hold" in msg:
                tag = msg.pop("hold")
                time.sleep(2 * DRIVER_MEMORY_PERIOD_S)  # the daemon charges what the driver holds itself, each period
                s = Sample(tag, msg, client.get(box.name).memory_used, process_used(gpu_uuid, probe.pid))
                samples[tag] = s
                if on_hold:
                    on_hold(probe, s)
                probe.answer()
            elif "result" in msg:
                result = msg["result"]
                break
        try:
            probe.proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise ProbeError("did not exit after its result") from None
    finally:
        probe.kill()
    took, left = wait_released(client, box.name) if reclaim else (0.0, client.get(box.name).memory_used)
    return Outcome(result, samples, left, took)


def wait_released(client: AllocatorClient, name: str, seconds: float = 5) -> tuple[float, int]:
    """(how long until the slice's charge was 0, what was left at the end) from now."""
    start = time.monotonic()
    while client.get(name).memory_used and time.monotonic() - start < seconds:
        time.sleep(0.01)
    return time.monotonic() - start, client.get(name).memory_used

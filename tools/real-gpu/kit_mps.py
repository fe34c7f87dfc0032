"""NVIDIA's Multi-Process Service on the kit's GPU, for the `mps` step: what an
MPS-backed hard share would give (issue 46's optional mode), measured before
gpuslice builds one.

Public facts it relies on (the driver's MPS documentation and the
nvidia-cuda-mps-control(1) page): `nvidia-cuda-mps-control -f` runs the
control daemon in the foreground (`-d`: as a daemon); a CUDA program whose
CUDA_MPS_PIPE_DIRECTORY names its pipes connects to it at cuInit, and runs
without MPS if that fails; the daemon starts one server per user; a client's
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (Volta and later) limits the share of each
device's threads it may use, below any limit the daemon sets; `quit` on the
daemon's stdin ends it. The kit's daemon has pipe and log directories of its
own and sees only the kit's GPU, so it touches nothing else on the machine
and nothing of the GPU's settings."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"
THREADS = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
QUIT_S = 15.0  # the daemon's end: its servers wait for their clients' exits
ASK_S = 10.0


class MpsError(RuntimeError):
    pass


@dataclass
class Mps:
    control: str
    pipe: Path
    log: Path
    env: dict[str, str]  # the daemon's own: its pipes, its log, the kit's GPU

    def client_env(self, env: dict[str, str], threads: int | None = None) -> dict[str, str]:
        """A client's environment: the daemon's pipes, and its thread limit where it has one."""
        out = {**env, "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe)}
        out.pop(THREADS, None)
        if threads is not None:
            out[THREADS] = str(threads)
        return out

    def ask(self, command: str) -> str:
        """One command to the control daemon; its answer."""
        r = subprocess.run([self.control], input=command + "\n", env=self.env, capture_output=True, text=True,
                           timeout=ASK_S)  # fmt: skip
        if r.returncode != 0:
            raise MpsError(f"{command}: exit {r.returncode}: {(r.stderr or r.stdout).strip()[-300:]}")
        return r.stdout.strip()

    def servers(self) -> list[int]:
        return [int(w) for w in self.ask("get_server_list").split() if w.isdigit()]

    def clients(self) -> list[int]:
        """Every client of every server, as the daemon numbers them."""
        return [int(w) for s in self.servers() for w in self.ask(f"get_client_list {s}").split() if w.isdigit()]

    def log_tail(self, lines: int = 20) -> str:
        path = self.log / "control.log"
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def control_binary() -> str | None:
    return shutil.which(CONTROL)


@contextlib.contextmanager
def running(control: str, gpu_uuid: str) -> Iterator[Mps]:
    """The control daemon for one GPU, in the foreground (`-f`) as the kit's own child, in
    directories of its own; quit, then waited for (killed past QUIT_S) on the way out."""
    with tempfile.TemporaryDirectory(prefix="gs-mps-") as work:
        pipe, log = Path(work) / "pipe", Path(work) / "log"
        pipe.mkdir()
        log.mkdir()
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu_uuid, "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
               "CUDA_MPS_LOG_DIRECTORY": str(log)}  # fmt: skip
        env.pop(THREADS, None)
        mps = Mps(control, pipe, log, env)
        with open(log / "foreground.log", "w") as out:
            proc = subprocess.Popen([control, "-f"], env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        try:
            _ready(mps, proc)
            yield mps
        finally:
            with contextlib.suppress(MpsError, subprocess.TimeoutExpired, OSError):
                mps.ask("quit")
            try:
                proc.wait(QUIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _ready(mps: Mps, proc: subprocess.Popen) -> None:
    """Until the daemon answers on its pipes (bounded), or why not."""
    deadline = time.monotonic() + ASK_S
    while True:
        if proc.poll() is not None:
            tail = (mps.log / "foreground.log").read_text(errors="replace").strip()[-300:]
            raise MpsError(f"{mps.control} -f exited {proc.returncode}: {tail or mps.log_tail()}")
        try:
            mps.servers()
            return
        except (MpsError, subprocess.TimeoutExpired) as e:
            if time.monotonic() > deadline:
                raise MpsError(f"{mps.control} did not answer within {ASK_S:g} s: {e}") from None
        time.sleep(0.2)

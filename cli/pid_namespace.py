"""A process in a new pid and mount namespace with its own /proc, standing for
a container's init (root only): what `gpuslice selftest`, the kit, the tests
and the benchmarks bind slices to when no container runtime is involved.

Its own /proc matters: the real driver's cuInit (570 and later) names its
threads through /proc/<getpid()>/task/<gettid()>/comm, and those ids are the
pid namespace's; with the host's /proc left mounted cuInit fails with
CUDA_ERROR_OPERATING_SYSTEM (seen on an H200, driver 580). Every container
runtime mounts a new /proc in a container, so this does too."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path


def first_child(pid: int, seconds: float = 5) -> int:
    """The first child of pid (unshare's, nsenter's: the process they forked), or 0."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.01)
    return 0


class PidNamespace:
    """Made from a thread that outlives it: the parent-death signal follows the
    thread that started it, not the process. `pid=False`: a mount namespace
    alone, in the caller's pid namespace (and its /proc): for processes that are
    to be no container's, as the caller's own are not."""

    def __init__(self, pid: bool = True) -> None:
        # its own mount namespace and /proc too, as every container has. It dies with its parent (setpriv's
        # parent-death signal on unshare, whose --kill-child takes the namespace's init along, and
        # the kernel every process in the namespace), so a SIGKILLed caller leaves no process
        # holding a slice: the daemon's sweeper reclaims the slices within its interval
        self.pid = pid
        own = ["--pid", "--mount", "--mount-proc"] if pid else ["--mount"]
        self.proc = subprocess.Popen(["setpriv", "--pdeathsig", "KILL", "unshare", *own,
                                      "--fork", "--kill-child", "sleep", "600"])  # fmt: skip
        self.init_pid = first_child(self.proc.pid)
        if not self.init_pid:
            self.proc.kill()
            raise RuntimeError("unshare did not start its child")

    def command(self, argv: list[str], cwd: str | None = None) -> list[str]:
        """argv run inside this pid namespace and its mount namespace (its /proc),
        in cwd (by default the caller's: entering a mount namespace starts at /)."""
        wd = cwd or os.getcwd()
        own = ["--pid", "--mount"] if self.pid else ["--mount"]
        return ["nsenter", "--target", str(self.init_pid), *own, f"--wd={wd}", "--", *argv]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

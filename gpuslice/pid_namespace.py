"""A process in a new pid and mount namespace, standing for a container's init
(root only): what `gpuslice selftest`, the tests and the benchmarks bind slices
to when no container runtime is involved."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path


class PidNamespace:
    def __init__(self) -> None:
        # its own mount namespace too, as every container has; gone after 10 min if leaked
        self.proc = subprocess.Popen(["unshare", "--pid", "--mount", "--fork", "--kill-child", "sleep", "600"])
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

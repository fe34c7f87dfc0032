"""Who a process is, container-wise: its pid namespace and cgroup, read from
/proc in the daemon's view."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gpuslice import errors


class NoSuchProcess(errors.NotFound):
    pass


@dataclass(frozen=True)
class Identity:
    pid: int
    pid_ns: int
    cgroup: str
    start_time: int  # clock ticks after boot; tells a reused pid apart


def _cgroup(pid: int) -> str:
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    # cgroup v2 ("0::/path"); on hybrid hosts prefer it, else the systemd hierarchy
    for line in lines:
        if line.startswith("0::"):
            return line[3:]
    for line in lines:
        if ":name=systemd:" in line:
            return line.split(":", 2)[2]
    return lines[0].split(":", 2)[2] if lines else ""


def start_time(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[19])


def of_pid(pid: int) -> Identity:
    try:
        return Identity(pid, os.stat(f"/proc/{pid}/ns/pid").st_ino, _cgroup(pid), start_time(pid))
    except (FileNotFoundError, ProcessLookupError) as e:
        raise NoSuchProcess(f"no process {pid}") from e


def alive(pid: int, started: int) -> bool:
    try:
        return start_time(pid) == started
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return False

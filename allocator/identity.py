"""Who a process is, container-wise: its pid namespace and cgroup, read from
/proc in the daemon's view (a ProcFs: the node's /proc, or a directory of the
same files in a test).  A socket's peer is held by a pidfd taken when the
connection is accepted, never by a bare pid: a pid is reused within seconds on
a busy node, and the process that reuses it is not the one that connected."""

from __future__ import annotations

import os
import signal
import socket
import struct
import time
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


@dataclass(frozen=True)
class ProcFs:
    """The files of /proc that say who a process is, under `root`."""

    root: Path = Path("/proc")

    def cgroup(self, pid: int) -> str:
        lines = (self.root / str(pid) / "cgroup").read_text().splitlines()
        # cgroup v2 ("0::/path"); on hybrid hosts prefer it, else the systemd hierarchy
        for line in lines:
            if line.startswith("0::"):
                return line[3:]
        for line in lines:
            if ":name=systemd:" in line:
                return line.split(":", 2)[2]
        return lines[0].split(":", 2)[2] if lines else ""

    def start_time(self, pid: int) -> int:
        """Clock ticks after boot (stat's 22nd field, after the command name, which may hold ")")."""
        # a path of strings, not Paths: joining Paths cost twice the read (the sweeper at 2,000 slices)
        fd = os.open(f"{os.fspath(self.root)}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            stat = os.read(fd, 4096)  # one read: the sweeper asks this of every bound slice
        finally:
            os.close(fd)
        return int(stat.rsplit(b")", 1)[1].split()[19])

    def pid_ns(self, pid: int) -> int:
        """The pid namespace's inode, from the link's text ("pid:[4026531836]")."""
        return int(os.readlink(self.root / str(pid) / "ns" / "pid").split("[", 1)[1].rstrip("]"))

    def pidfd_pid(self, pidfd: int) -> int:
        """The pid a pidfd of this process refers to (fdinfo's "Pid:"); 0 or less once it exited."""
        for line in (self.root / "self" / "fdinfo" / str(pidfd)).read_text().splitlines():
            if line.startswith("Pid:"):
                return int(line.split()[1])
        return 0


PROC = ProcFs()


def start_time(pid: int, proc: ProcFs = PROC) -> int:
    return proc.start_time(pid)


def of_pid(pid: int, proc: ProcFs = PROC) -> Identity:
    try:
        return Identity(pid, proc.pid_ns(pid), proc.cgroup(pid), proc.start_time(pid))
    except (FileNotFoundError, ProcessLookupError) as e:
        raise NoSuchProcess(f"no process {pid}") from e


def alive(pid: int, started: int, proc: ProcFs = PROC) -> bool:
    try:
        return proc.start_time(pid) == started
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return False


SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux 6.5: the connecting process's pidfd
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Peer:
    """The process at the other end of a unix socket: a pidfd (closed by close())."""

    pidfd: int
    uid: int
    gid: int

    def close(self) -> None:
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1


def _ticks_now() -> int:
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * _TICKS)


def peer_of(conn: socket.socket) -> Peer:
    """The peer of a just-accepted connection.  SO_PEERPIDFD names the very
    process that connected; without it (kernels before 6.5) a pidfd of the
    SO_PEERCRED pid, refused when that process started after the connection
    was accepted (its pid was reused)."""
    pid, uid, gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    try:
        return Peer(conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD), uid, gid)
    except OSError:
        pass
    accepted = _ticks_now()
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError as e:
        raise NoSuchProcess(f"the process that connected (pid {pid}) is gone") from e
    try:
        if start_time(pid) > accepted + 1:
            raise NoSuchProcess(f"pid {pid} was reused after it connected")
    except (FileNotFoundError, ProcessLookupError) as e:
        os.close(pidfd)
        raise NoSuchProcess(f"the process that connected (pid {pid}) is gone") from e
    except NoSuchProcess:
        os.close(pidfd)
        raise
    return Peer(pidfd, uid, gid)


def pid_of_pidfd(pidfd: int, proc: ProcFs = PROC) -> int:
    """The pid a pidfd refers to in the daemon's namespace; NoSuchProcess once it exited."""
    pid = proc.pidfd_pid(pidfd)
    if pid > 0:
        return pid
    raise NoSuchProcess("the process that connected has exited")


def of_pidfd(pidfd: int, proc: ProcFs = PROC) -> Identity:
    """The identity of the process a pidfd holds, read from /proc and valid
    because the same process is still alive after the read (so its pid was
    not reused in between)."""
    pid = pid_of_pidfd(pidfd, proc)
    who = of_pid(pid, proc)
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError as e:
        raise NoSuchProcess(f"process {pid} exited while it was identified") from e
    return who

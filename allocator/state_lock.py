"""One daemon per state directory: an exclusive lock held for the daemon's
life, taken before any socket is touched, so that a second daemon on the same
configuration exits instead of stealing the first one's sockets and store."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from gpuslice import errors

LOCK_NAME = "daemon.lock"


class AlreadyRunning(errors.FailedPrecondition):
    """Another daemon holds this state directory."""


class StateLock:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LOCK_NAME
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise AlreadyRunning(
                f"{state_dir}: another gpuslice daemon (pid {holder}) holds this state directory; "
                "stop it first, or give this one another state_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd  # held open: the kernel drops the lock when the daemon dies, kill -9 included

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

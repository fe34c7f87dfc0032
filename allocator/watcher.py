"""Watches the processes attached to slices (pidfds) and zeroes a process's
usage in its slice's files the moment it exits, SIGKILL included.  It also
knows which slices have processes at all: the only ones whose launches the
compute controller has to look at."""

from __future__ import annotations

import logging
import os
import selectors
import signal
import threading
from collections.abc import Callable

from gpuslice.allocator.slice_files import SliceFiles

log = logging.getLogger(__name__)


class ProcessWatcher:
    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._stop = False
        self._in_use: dict[str, tuple[SliceFiles, int]] = {}  # slice id -> (files, processes watched)
        self.on_exit: list[Callable[[], None]] = []  # told once an exited process's row is released
        self.on_watch: list[Callable[[], None]] = []  # told once a process is watched (its slice is in use)
        self._thread = threading.Thread(target=self._run, name="pidfd-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop = True
        os.write(self._wake_w, b"x")
        self._thread.join(5)

    def watch(self, pid: int, files: SliceFiles, slot: int) -> bool:
        """Watch pid; False (and its row cleared) if it is already gone."""
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            files.release_slot(slot)
            return False
        self._register(fd, pid, files, slot)
        return True

    def _register(self, fd: int, pid: int, files: SliceFiles, slot: int) -> None:
        with self._lock:
            self._sel.register(fd, selectors.EVENT_READ, (pid, files, slot))
            _, n = self._in_use.get(files.slice_id, (files, 0))
            self._in_use[files.slice_id] = (files, n + 1)
        os.write(self._wake_w, b"x")
        for told in self.on_watch:
            told()

    def _unregister(self, fd: int, files: SliceFiles) -> None:
        """(under the lock)"""
        self._sel.unregister(fd)
        os.close(fd)
        _, n = self._in_use.get(files.slice_id, (files, 1))
        if n <= 1:
            self._in_use.pop(files.slice_id, None)
        else:
            self._in_use[files.slice_id] = (files, n - 1)

    def files_in_use(self) -> dict[str, SliceFiles]:
        """The slices with at least one process attached, and their files."""
        with self._lock:
            return {sid: f for sid, (f, _) in self._in_use.items()}

    def watch_pidfd(self, pidfd: int, pid: int, files: SliceFiles, slot: int) -> bool:
        """Watch the process a pidfd holds (a copy is kept); False (and its row
        cleared) if it has exited."""
        try:
            signal.pidfd_send_signal(pidfd, 0)
        except ProcessLookupError:
            files.release_slot(slot)
            return False
        self._register(os.dup(pidfd), pid, files, slot)
        return True

    def forget(self, slice_id: str) -> None:
        with self._lock:
            if slice_id not in self._in_use:
                return
            for key in list(self._sel.get_map().values()):
                if key.data and key.data[1].slice_id == slice_id:
                    self._unregister(key.fd, key.data[1])

    def _run(self) -> None:
        while not self._stop:
            for key, _ in self._sel.select(timeout=1.0):
                if key.data is None:
                    os.read(self._wake_r, 4096)
                    continue
                pid, files, slot = key.data
                with self._lock:
                    try:
                        self._unregister(key.fd, files)
                    except (KeyError, ValueError):
                        continue  # forgotten meanwhile
                if files.slot_pids().get(slot) == pid:
                    freed = files.release_slot(slot)
                    log.info("process %d of slice %s exited; %d bytes returned", pid, files.slice_id, freed)
                    for told in self.on_exit:
                        told()

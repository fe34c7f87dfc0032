"""Watches the processes attached to slices (pidfds) and zeroes a process's
usage in its slice's files the moment it exits, SIGKILL included."""

from __future__ import annotations

import logging
import os
import selectors
import signal
import threading

from gpuslice.allocator.slice_files import SliceFiles

log = logging.getLogger(__name__)


class ProcessWatcher:
    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._stop = False
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
        with self._lock:
            self._sel.register(fd, selectors.EVENT_READ, (pid, files, slot))
        os.write(self._wake_w, b"x")
        return True

    def watch_pidfd(self, pidfd: int, pid: int, files: SliceFiles, slot: int) -> bool:
        """Watch the process a pidfd holds (a copy is kept); False (and its row
        cleared) if it has exited."""
        try:
            signal.pidfd_send_signal(pidfd, 0)
        except ProcessLookupError:
            files.release_slot(slot)
            return False
        fd = os.dup(pidfd)
        with self._lock:
            self._sel.register(fd, selectors.EVENT_READ, (pid, files, slot))
        os.write(self._wake_w, b"x")
        return True

    def forget(self, slice_id: str) -> None:
        with self._lock:
            for key in list(self._sel.get_map().values()):
                if key.data and key.data[1].slice_id == slice_id:
                    self._sel.unregister(key.fd)
                    os.close(key.fd)

    def _run(self) -> None:
        while not self._stop:
            for key, _ in self._sel.select(timeout=1.0):
                if key.data is None:
                    os.read(self._wake_r, 4096)
                    continue
                pid, files, slot = key.data
                with self._lock:
                    try:
                        self._sel.unregister(key.fd)
                    except (KeyError, ValueError):
                        continue  # forgotten meanwhile
                    os.close(key.fd)
                if files.slot_pids().get(slot) == pid:
                    freed = files.release_slot(slot)
                    log.info("process %d of slice %s exited; %d bytes returned", pid, files.slice_id, freed)

"""The daemon soaked (issue 14): 32 clients reserving, binding, checking and
releasing slices for 40 s while the daemon is killed with SIGKILL twice, its
slice socket is deleted and its filesystem (a 16 MB tmpfs) is full for a moment.  Two 16 GiB
GPUs hold exactly 32 slices of 1 GiB, so one slice lost (never released) shows
as a client finding no room, and one double-booked as more than 16 GiB on a
GPU."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import grpc
import pytest

from tests.harness.machine import gpu, needs_root

CLIENTS = 32
SOAK_S = 40.0
GIB = 1 << 30
RETRY = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}


class Soak:
    def __init__(self, factory, where: Path) -> None:  # type: ignore[no-untyped-def]
        self.factory = factory
        self.where = where
        self.d = factory(
            gpus=[gpu("16Gi"), gpu("16Gi")],
            state_dir=str(where / "state"),
            slice_files_dir=str(where / "slices"),
        )
        self.stop = threading.Event()
        self.problems: list[str] = []
        self.sequences = 0
        self.retries: dict[str, int] = {}  # status code -> calls retried
        self._lock = threading.Lock()
        self.used_before_fill = 0

    def call(self, what: str, fn):  # type: ignore[no-untyped-def]
        """fn(client) until it is answered; faults make it retry, never give up."""
        deadline = time.monotonic() + 30
        while True:
            try:
                with self.d.client() as c:
                    return fn(c)
            except grpc.RpcError as e:
                retriable = e.code() in RETRY and "no room" not in (e.details() or "")
                if not retriable or time.monotonic() > deadline:
                    self.problem(f"{what}: {e.code().name} {e.details()}")
                    raise
                with self._lock:
                    self.retries[e.code().name] = self.retries.get(e.code().name, 0) + 1
                time.sleep(0.05)

    def problem(self, text: str) -> None:
        with self._lock:
            self.problems.append(text)

    def client(self, k: int) -> None:
        i = 0
        while not self.stop.is_set():
            cid = f"t{k}-{i}"
            i += 1
            try:
                self.call("Reserve", lambda c: c.reserve(cid, {"gpuslice.io/memory": "1Gi"}))  # noqa: B023
                self.call("Bind", lambda c: c.bind(cid, os.getpid()))  # noqa: B023
                got = self.call("Get", lambda c: c.get(cid))  # noqa: B023
                if got.state != "bound" or got.container_id != cid:
                    self.problem(f"{cid}: after Bind the daemon says {got.state} {got.container_id}")
                self.call("Release", lambda c: c.release(cid))  # noqa: B023
            except grpc.RpcError:
                return
            with self._lock:
                self.sequences += 1

    def check_books(self) -> None:
        """Never more than a GPU holds, never a container twice."""
        while not self.stop.wait(0.5):
            try:
                with self.d.client() as c:
                    slices = c.list()
            except grpc.RpcError:
                continue  # down for the moment
            ids = [s.container_id for s in slices]
            if len(ids) != len(set(ids)):
                self.problem(f"a container holds two slices: {sorted(ids)}")
            per_gpu: dict[str, int] = {}
            for s in slices:
                for g in s.gpus:
                    per_gpu[g.uuid] = per_gpu.get(g.uuid, 0) + g.memory_limit
            if any(v > 16 * GIB for v in per_gpu.values()):
                self.problem(f"double-booked: {per_gpu}")

    def kill_and_restart(self) -> None:
        self.d.kill()  # SIGKILL
        self.d = self.factory.restart(self.d)

    def delete_slice_socket(self) -> None:
        self.d.slice_socket.unlink()
        deadline = time.monotonic() + 5
        while not self.d.slice_socket.exists():
            if time.monotonic() > deadline:
                self.problem("the deleted slice socket did not come back within 5 s")
                return
            time.sleep(0.05)

    def fill_disk(self) -> None:
        filler = self.where / "filler"
        used = shutil.disk_usage(self.where).used
        try:
            with open(filler, "wb") as f:
                while True:
                    f.write(b"\0" * (64 << 10))
                    f.flush()
        except OSError:
            pass  # full
        time.sleep(1.5)
        filler.unlink(missing_ok=True)
        self.used_before_fill = used
        if self.d.proc.poll() is not None:
            self.problem(f"the daemon died of the full disk (exit {self.d.proc.returncode})")


@pytest.fixture
def tmpfs(tmp_path: Path):  # type: ignore[no-untyped-def]
    where = tmp_path / "fs"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(where)], check=True)
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


@needs_root
def test_soak_with_kills_a_deleted_socket_and_a_full_disk(daemon, tmpfs):
    soak = Soak(daemon, tmpfs)
    workers = [threading.Thread(target=soak.client, args=(k,)) for k in range(CLIENTS)]
    checker = threading.Thread(target=soak.check_books)
    for t in [*workers, checker]:
        t.start()
    faults = [soak.kill_and_restart, soak.delete_slice_socket, soak.fill_disk, soak.kill_and_restart]
    started = time.monotonic()
    for n, fault in enumerate(faults, 1):
        time.sleep(max(0.0, started + n * SOAK_S / (len(faults) + 1) - time.monotonic()))
        fault()
    time.sleep(max(0.0, started + SOAK_S - time.monotonic()))
    soak.stop.set()
    for t in [*workers, checker]:
        t.join(60)
    assert not soak.problems, soak.problems[:5]
    assert soak.sequences > 200, f"only {soak.sequences} sequences in {SOAK_S:.0f} s"
    # each fault was felt: the daemon away (kills), the disk full
    assert soak.retries.get("UNAVAILABLE") and soak.retries.get("RESOURCE_EXHAUSTED"), soak.retries
    with soak.d.client() as c:
        assert list(c.list()) == []  # every slice released
    assert sorted(p.name for p in (tmpfs / "slices").iterdir() if p.name != "orphaned") == []
    soak.d.kill()
    with sqlite3.connect(tmpfs / "state" / "state.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("SELECT COUNT(*) FROM slices").fetchone()[0] == 0
    # the store's write-ahead log is truncated after checkpoints: the state stays small
    assert soak.used_before_fill < 4 << 20, f"{soak.used_before_fill} bytes in use before the disk was filled"
    print(f"soak: {soak.sequences} sequences, {soak.retries} retried calls, {soak.used_before_fill} bytes in use")

"""The daemon soaked (issues 14, 31): 32 clients reserving, binding, checking
and releasing slices for 40 s while the daemon is killed with SIGKILL twice,
its slice socket is deleted, 200 container creates arrive at once through the
runtime shim, and its filesystem (a 16 MB tmpfs, which also holds the DRA
plugin's checkpoint and claim specs) is full for a moment; meanwhile a DRA
plugin prepares and unprepares claims.  GPUs 0 and 1 (16 GiB each) hold
exactly the clients' 32 slices of 1 GiB, so one slice lost (never released)
shows as a client finding no room, and one double-booked as more than 16 GiB
on a GPU; GPU 2 takes the claims and the burst."""

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

from gpuslice import errors
from gpuslice.cli import sim_daemon
from gpuslice.dra.checkpoint import Checkpoint
from gpuslice.dra.plugin import base_spec_source
from gpuslice.dra.prepare import ClaimRef, Preparer
from tests.harness.machine import gpu, needs_root, oci_bundle
from tests.harness.shim import SHIM, fake_runtime
from tools.dra_node import NODE, allocated

CLIENTS = 32
SOAK_S = 40.0
BURST = 200
CLAIMS = 2  # DRA claims prepared and unprepared in turn, 1 GiB each on GPU 2
GIB = 1 << 30
FULL_FOR_AT_MOST_S = 30.0  # a full filesystem is held until a call meets it, at most this long
RETRY = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}


class Soak:
    def __init__(self, factory, where: Path) -> None:  # type: ignore[no-untyped-def]
        self.factory = factory
        self.where = where
        self.d = factory(
            gpus=[gpu("16Gi"), gpu("16Gi"), gpu("16Gi")],
            state_dir=str(where / "state"),
            slice_files_dir=str(where / "slices"),
        )
        self.stop = threading.Event()
        self.problems: list[str] = []
        self.sequences = 0
        self.retries: dict[str, int] = {}  # status code -> calls retried
        self._lock = threading.Lock()
        self.used_before_fill = 0
        self.spec = where.parent / "node-spec.json"  # off the tmpfs: the node's spec is not what is tested
        assert sim_daemon.cdi_generate(self.d, self.spec).returncode == 0
        self.claim_specs = where / "plugin" / "cdi"
        self.checkpoint = where / "plugin" / "checkpoint.json"
        self.prepared = 0
        self.claims = {f"c{k}": allocated(f"soak-{k}", ("gpu-2", "1Gi", None)) for k in range(CLAIMS)}

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
                asked = {"gpuslice.io/memory": "1Gi", "gpuslice.io/device": str(k % 2)}
                self.call("Reserve", lambda c: c.reserve(cid, asked))  # noqa: B023
                self.call("Bind", lambda c: c.bind(cid, os.getpid()))  # noqa: B023
                got = self.call("Get", lambda c: c.get(cid))  # noqa: B023
                if got.state != "bound" or got.container_id != cid:
                    self.problem(f"{cid}: after Bind the daemon says {got.state} {got.container_id}")
                self.call("Release", lambda c: c.release(cid))  # noqa: B023
            except grpc.RpcError:
                return
            with self._lock:
                self.sequences += 1

    def preparer(self) -> Preparer:
        claims = {c["metadata"]["name"]: c for c in self.claims.values()}
        return Preparer(NODE, self.d.client(), lambda namespace, name: claims[name], base_spec_source(self.spec),
                        self.claim_specs, Checkpoint(self.checkpoint))  # fmt: skip

    def dra(self, verb: str, claim: dict) -> None:
        """The kubelet's way: a prepare or unprepare retried until it is done."""
        ref = ClaimRef(claim["metadata"]["uid"], "default", claim["metadata"]["name"])
        deadline = time.monotonic() + 30
        while True:
            try:
                getattr(self.preparer(), verb)(ref)  # a new plugin each time: as after a restart
                return
            except (errors.Unavailable, errors.ResourceExhausted) as e:
                if time.monotonic() > deadline:
                    self.problem(f"{verb} {ref.name}: {e}")
                    raise
                key = "dra full disk" if "No space left" in str(e) else f"dra {type(e).__name__}"
                with self._lock:
                    self.retries[key] = self.retries.get(key, 0) + 1
                time.sleep(0.05)

    def kubelet(self) -> None:
        """Claims prepared and unprepared in turn, as pods come and go."""
        while not self.stop.is_set():
            for claim in self.claims.values():
                try:
                    self.dra("prepare", claim)
                    self.dra("unprepare", claim)
                except Exception as e:  # anything but a retried kind: an OSError is a bug too
                    self.problem(f"DRA {claim['metadata']['name']}: {type(e).__name__}: {e}")
                    return
                with self._lock:
                    self.prepared += 1

    def burst(self) -> None:
        """BURST container creates at once through the runtime shim, each 64 MiB
        on GPU 2: every one reserved, then all released."""
        env = {**os.environ, "GPUSLICE_SOCKET": str(self.d.socket), "GPUSLICE_CDI_SPEC": str(self.spec),
               "GPUSLICE_RUNTIME": str(fake_runtime(self.where.parent))}  # fmt: skip
        shims = []
        for i in range(BURST):
            bundle = self.where.parent / "bursts" / f"b{i}"
            if not bundle.exists():
                oci_bundle(bundle, {"gpuslice.io/memory": "64Mi", "gpuslice.io/device": "2"})
            shims.append(subprocess.Popen([str(SHIM), "create", "--bundle", str(bundle), f"burst-{i}"], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))  # fmt: skip
        failed = [p.stderr.read().strip() for p in shims if p.wait(120) != 7]  # type: ignore[union-attr]
        if failed:
            self.problem(f"{len(failed)} of {BURST} creates failed: {failed[:2]}")
        for i in range(BURST):
            self.call("Release", lambda c: c.release(f"burst-{i}"))  # noqa: B023

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

    @staticmethod
    def fill(where: Path) -> Path:
        filler = where / "filler"
        try:
            with open(filler, "wb") as f:
                while True:
                    f.write(b"\0" * (64 << 10))
                    f.flush()
        except OSError:
            pass  # full
        return filler

    def felt(self, key: str, before: int, seconds: float = FULL_FOR_AT_MOST_S) -> None:
        """Wait until a call met the fault (retries[key] grew): each fault is observed, however
        slow the machine; never felt within `seconds` is a problem of the soak's own."""
        deadline = time.monotonic() + seconds
        while self.retries.get(key, 0) <= before:
            if time.monotonic() > deadline:
                self.problem(f"the full disk was not felt ({key}) within {seconds:g} s: {self.retries}")
                return
            time.sleep(0.02)

    def fill_disk(self) -> None:
        """The DRA plugin's filesystem full first (its prepares reach the
        checkpoint or a claim's spec and fail there), then the daemon's too;
        each held full until a call has met it, then both freed."""
        used = shutil.disk_usage(self.where).used
        before = self.retries.get("dra full disk", 0)
        fillers = [self.fill(self.where / "plugin")]
        self.felt("dra full disk", before)
        before = self.retries.get("RESOURCE_EXHAUSTED", 0)
        fillers.append(self.fill(self.where))
        self.felt("RESOURCE_EXHAUSTED", before)
        for filler in fillers:
            filler.unlink(missing_ok=True)
        self.used_before_fill = used
        if self.d.proc.poll() is not None:
            self.problem(f"the daemon died of the full disk (exit {self.d.proc.returncode})")


@pytest.fixture
def tmpfs(tmp_path: Path):  # type: ignore[no-untyped-def]
    where = tmp_path / "fs"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(where)], check=True)
    plugin = where / "plugin"  # the DRA plugin's directory: a filesystem of its own, filled apart
    plugin.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(plugin)], check=True)
    yield where
    subprocess.run(["umount", "-l", str(plugin)], check=False)
    subprocess.run(["umount", "-l", str(where)], check=False)


@needs_root
def test_soak_with_kills_a_deleted_socket_and_a_full_disk(daemon, tmpfs):
    soak = Soak(daemon, tmpfs)
    workers = [threading.Thread(target=soak.client, args=(k,)) for k in range(CLIENTS)]
    workers.append(threading.Thread(target=soak.kubelet))
    checker = threading.Thread(target=soak.check_books)
    for t in [*workers, checker]:
        t.start()
    faults = [soak.kill_and_restart, soak.delete_slice_socket, soak.burst, soak.fill_disk, soak.kill_and_restart]
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
    assert soak.prepared > 10, f"only {soak.prepared} claims prepared and unprepared in {SOAK_S:.0f} s"
    # each fault was felt: the daemon away (kills), the disk full (the daemon's, and the plugin's checkpoint)
    assert soak.retries.get("UNAVAILABLE") and soak.retries.get("RESOURCE_EXHAUSTED"), soak.retries
    assert soak.retries.get("dra Unavailable") and soak.retries.get("dra full disk"), soak.retries
    with soak.d.client() as c:
        assert list(c.list()) == []  # every slice released, the claims' and the burst's too
    assert Checkpoint(soak.checkpoint).claims == {} and list(soak.claim_specs.iterdir()) == []
    assert sorted(p.name for p in (tmpfs / "slices").iterdir() if p.name != "orphaned") == []
    soak.d.kill()
    with sqlite3.connect(tmpfs / "state" / "state.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("SELECT COUNT(*) FROM slices").fetchone()[0] == 0
    # the store's write-ahead log is truncated after checkpoints: the state stays small
    assert soak.used_before_fill < 4 << 20, f"{soak.used_before_fill} bytes in use before the disk was filled"
    print(
        f"soak: {soak.sequences} sequences, {soak.prepared} claims prepared and unprepared, {BURST} creates at once, "
        f"{soak.retries} retried calls, {soak.used_before_fill} bytes in use"
    )

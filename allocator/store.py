"""The slice store: SQLite in WAL mode, one transaction per change.

A reservation is in the store before any client hears of it, and placement
reads the store inside the same write transaction, so after kill -9 at any
moment the restarted daemon sees exactly what it had committed: no double
booking, no leak."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TypeVar

from gpuslice import errors

T = TypeVar("T")

# The schema's versions, in order: MIGRATIONS[n] takes a store from version n to
# n + 1 (PRAGMA user_version).  Version 1 is the first released layout; a store
# made before versions were kept has user_version 0 and tables of version 1.
MIGRATIONS: tuple[str, ...] = (
    """
CREATE TABLE IF NOT EXISTS slices (
    id TEXT PRIMARY KEY,
    container_id TEXT NOT NULL UNIQUE,
    state TEXT NOT NULL CHECK (state IN ('reserved', 'bound')),
    request TEXT NOT NULL,
    policy TEXT NOT NULL,
    priority TEXT NOT NULL,
    whole INTEGER NOT NULL,
    owner TEXT NOT NULL DEFAULT '',
    created_ms INTEGER NOT NULL,
    bound_ms INTEGER,
    pid INTEGER,
    pid_ns INTEGER,
    cgroup TEXT,
    pid_start INTEGER
);
CREATE TABLE IF NOT EXISTS allocations (
    slice_id TEXT NOT NULL REFERENCES slices(id) ON DELETE CASCADE,
    gpu_index INTEGER NOT NULL,
    gpu_uuid TEXT NOT NULL,
    memory INTEGER NOT NULL,
    cores INTEGER NOT NULL,
    PRIMARY KEY (slice_id, gpu_uuid)
);
CREATE INDEX IF NOT EXISTS allocations_by_gpu ON allocations(gpu_uuid);
""",
    # 2: what a slice belongs to is a column (kind: container, claim, member; a
    # member's claim slice by id), no longer read from its key's "claim-" prefix
    # or a pseudo-annotation in its request; an allocation is one share (a GPU,
    # a request, a share ID) with its own size, compute policy and priority
    """
ALTER TABLE slices ADD COLUMN kind TEXT NOT NULL DEFAULT 'container';
ALTER TABLE slices ADD COLUMN member_of TEXT REFERENCES slices(id) ON DELETE CASCADE;
UPDATE slices SET kind = 'member',
    member_of = (SELECT c.id FROM slices AS c
                 WHERE c.container_id = json_extract(slices.request, '$."gpuslice.io/member-of"')),
    request = '{}'
    WHERE json_extract(request, '$."gpuslice.io/member-of"') IS NOT NULL;
DELETE FROM slices WHERE kind = 'member' AND member_of IS NULL;
UPDATE slices SET kind = 'claim' WHERE kind = 'container' AND container_id LIKE 'claim-%';
CREATE INDEX slices_by_member_of ON slices(member_of);
CREATE TABLE shares (
    slice_id TEXT NOT NULL REFERENCES slices(id) ON DELETE CASCADE,
    share TEXT NOT NULL DEFAULT '',
    gpu_index INTEGER NOT NULL,
    gpu_uuid TEXT NOT NULL,
    memory INTEGER NOT NULL,
    cores INTEGER NOT NULL,
    policy TEXT NOT NULL DEFAULT '',
    priority TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (slice_id, gpu_uuid, share)
);
INSERT INTO shares (slice_id, gpu_index, gpu_uuid, memory, cores)
    SELECT slice_id, gpu_index, gpu_uuid, memory, cores FROM allocations;
DROP TABLE allocations;
ALTER TABLE shares RENAME TO allocations;
CREATE INDEX allocations_by_gpu ON allocations(gpu_uuid);
""",
    # 3: the Kubernetes workload a slice serves (namespace, pod, container
    # name), for the metrics' labels; empty where there is none (Podman, ctr)
    """
ALTER TABLE slices ADD COLUMN workload_namespace TEXT NOT NULL DEFAULT '';
ALTER TABLE slices ADD COLUMN workload_pod TEXT NOT NULL DEFAULT '';
ALTER TABLE slices ADD COLUMN workload_container TEXT NOT NULL DEFAULT '';
""",
)
SCHEMA_VERSION = len(MIGRATIONS)


SQLITE_IOERR, SQLITE_FULL = 10, 13  # primary result codes (the low byte of extended ones)


class StoreError(errors.FailedPrecondition):
    """The store cannot be used as it is (a newer schema, a file that is not a store)."""


class OwnerKind(str, Enum):
    """What a slice belongs to. A new kind of owner (say, a device plugin's
    allocation) is a new value here, not a convention in a key or a request."""

    CONTAINER = "container"  # a container's own slice (hook, shim, CLI)
    CLAIM = "claim"  # a DRA claim's slice: kept until the kubelet unprepares it
    # a device plugin's allocation: the units of one resource the kubelet gave
    # one container; kept while the kubelet holds them (pod-resources), joined
    # by the container's shares as a claim is
    DEVICES = "devices"
    MEMBER = "member"  # a container in a claim's slice: no capacity of its own
    # the shares of claims that a container's processes charge together (the
    # claim devices it was given): the ledger its members attach to; its
    # allocations are copies of those shares and book nothing (the claims do)
    SHARES = "shares"


@dataclass(frozen=True)
class Allocation:
    """One share of a slice on one GPU. `share` tells shares on the same GPU
    apart (a DRA share ID); policy and priority are the share's own where set,
    else the slice's."""

    gpu_index: int
    gpu_uuid: str
    memory: int
    cores: int
    share: str = ""
    policy: str = ""
    priority: str = ""


@dataclass(frozen=True)
class Workload:
    """The Kubernetes workload a slice serves, as people look for it: its
    namespace, pod and container name (a claim's slice: the claim's namespace
    and the pod it is reserved for, no container). Empty outside Kubernetes."""

    namespace: str = ""
    pod: str = ""
    container: str = ""

    def __bool__(self) -> bool:
        return bool(self.namespace or self.pod or self.container)


NO_WORKLOAD = Workload()


@dataclass(frozen=True)
class SliceRecord:
    id: str
    container_id: str
    state: str
    request: dict
    policy: str
    priority: str
    whole: bool
    owner: str
    created_ms: int
    bound_ms: int | None
    pid: int | None
    pid_ns: int | None
    cgroup: str | None
    pid_start: int | None
    allocations: tuple[Allocation, ...]
    kind: OwnerKind = OwnerKind.CONTAINER
    member_of: str | None = None  # a member's claim slice (its id)
    workload: Workload = NO_WORKLOAD

    @property
    def file_gpus(self) -> tuple[str, ...]:
        """The UUIDs of its slice files' GPUs, in the files' order: shares on
        one GPU add up to one entry there (SliceManager._limits)."""
        return tuple(dict.fromkeys(a.gpu_uuid for a in self.allocations))

    @property
    def books(self) -> bool:
        """Whether its allocations count against the GPUs (a SHARES ledger's are its claims')."""
        return self.kind is not OwnerKind.SHARES


def migrate(db: sqlite3.Connection, path: Path) -> None:
    """Bring the store to SCHEMA_VERSION, one migration per transaction."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path}: slice store schema version {version} is newer than this gpuslice knows "
            f"({SCHEMA_VERSION}); run the gpuslice that wrote it"
        )
    for target in range(version + 1, SCHEMA_VERSION + 1):
        db.execute("BEGIN IMMEDIATE")
        try:
            for statement in MIGRATIONS[target - 1].split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute(f"PRAGMA user_version = {target}")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")


def now_ms() -> int:
    return int(time.time() * 1000)


def _refuse(path: Path, what: str) -> StoreError:
    return StoreError(
        f"{path}: {what}; the slices it held are unknown. Move it aside to start with an empty ledger "
        "(the slices' files are kept in the slice files directory), or restore it from a backup"
    )


class SliceStore:
    def __init__(self, path: Path, slices_with_files: Collection[str] = ()) -> None:
        """`slices_with_files`: the slices whose files are on disk; with any,
        a missing store is a lost one, not a first start."""
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        # SQLite would take an empty file for a new store: a ledger that lost its
        # content must not start as one that holds no slices
        if path.exists() and path.stat().st_size == 0:
            raise _refuse(path, "the slice store is empty (0 bytes), not a store this daemon made")
        if not path.exists() and slices_with_files:
            raise StoreError(
                f"{path}: the slice store is missing, but {len(slices_with_files)} slices have files "
                f"({', '.join(sorted(slices_with_files)[:3])}{', …' if len(slices_with_files) > 3 else ''}): "
                "the slices it held are unknown. Restore it "
                f"(from {path.name}.recovered beside it, written when the daemon saw it go, or a backup), "
                "or move the slice files directory aside to start with an empty ledger"
            )
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode: a commit survives kill -9 of the daemon (the OS has it);
            # only power loss can drop the last commits, and then every container is gone too.
            self._db.execute("PRAGMA synchronous=NORMAL")
            # a checkpoint every 256 pages (1 MiB) and the log cut back to that size after it: the
            # ledger stays about a megabyte on disk, whatever the churn (4 MiB and more by default)
            self._db.execute("PRAGMA wal_autocheckpoint=256")
            self._db.execute("PRAGMA journal_size_limit=1048576")
            self._db.execute("PRAGMA foreign_keys=ON")
            checked = self._db.execute("PRAGMA quick_check").fetchone()[0]
            if checked != "ok":
                raise _refuse(path, f"the slice store is damaged ({checked})")
            migrate(self._db, path)
        except sqlite3.DatabaseError as e:
            self._db.close()
            raise _refuse(path, f"not a readable slice store ({e})") from None
        except BaseException:
            self._db.close()
            raise
        self._lock = threading.RLock()  # reads take it too: one connection, no dirty reads
        st = path.stat()
        self._identity = (st.st_dev, st.st_ino)
        self._lost: str | None = None

    def lost(self) -> str | None:
        """Why the store this daemon opened is no longer at its path (deleted,
        or replaced by another file), or None. The first time, what the open
        connection still holds is copied to <path>.recovered."""
        if self._lost is None:
            try:
                st = self.path.stat()
                gone = None if (st.st_dev, st.st_ino) == self._identity else "was replaced by another file"
            except FileNotFoundError:
                gone = "was deleted"
            if gone is None:
                return None
            with self._lock:
                self._lost = f"the slice store {self.path} {gone} while the daemon ran"
                self._lost += self._save_copy()
        return self._lost

    def _save_copy(self) -> str:
        copy = self.path.with_name(self.path.name + ".recovered")
        try:
            with closing(sqlite3.connect(copy)) as out:
                self._db.backup(out)
            return f"; what it held is in {copy}: stop the daemon, move that to {self.path}, start it"
        except (sqlite3.Error, OSError) as e:
            return f"; no copy could be kept ({e}): restart the daemon with the store restored from a backup"

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        lost = self.lost()
        if lost:
            raise errors.Unavailable(f"{lost}; nothing was changed")
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
            except sqlite3.OperationalError as e:
                raise self._write_failed(e) from None

    def _write_failed(self, e: sqlite3.OperationalError) -> Exception:
        """A change the disk cannot take is the caller's one-line error, and
        the store is as it was (rolled back); the daemon goes on."""
        if (getattr(e, "sqlite_errorcode", 0) & 0xFF) in (SQLITE_IOERR, SQLITE_FULL):
            return errors.ResourceExhausted(
                f"the slice store {self.path} cannot take the change ({e}); nothing was changed. "
                "Free space on its filesystem"
            )
        return e

    def transaction(self, fn: Callable[[SliceStore], T]) -> T:
        """Run fn(self) in one write transaction; reads inside see the state it changes."""
        with self._tx():
            return fn(self)

    # -- reads (call inside or outside a transaction) ----------------------------
    _ALLOCATION = "gpu_index, gpu_uuid, memory, cores, share, policy, priority"

    def _record(self, row: tuple, allocs: tuple[Allocation, ...] | None = None) -> SliceRecord:
        if allocs is None:
            allocs = tuple(
                Allocation(*a)
                for a in self._db.execute(
                    f"SELECT {self._ALLOCATION} FROM allocations WHERE slice_id=? ORDER BY gpu_index, share",
                    (row[0],),
                )
            )
        return SliceRecord(
            row[0], row[1], row[2], json.loads(row[3]), row[4], row[5], bool(row[6]), row[7], row[8], row[9],
            row[10], row[11], row[12], row[13], allocs, OwnerKind(row[14]), row[15], Workload(*row[16:19]),
        )  # fmt: skip

    _COLUMNS = (
        "id, container_id, state, request, policy, priority, whole, owner, created_ms, bound_ms, pid, pid_ns, "
        "cgroup, pid_start, kind, member_of, workload_namespace, workload_pod, workload_container"
    )

    def get(self, container_id: str) -> SliceRecord | None:
        with self._lock:
            row = self._db.execute(f"SELECT {self._COLUMNS} FROM slices WHERE container_id=?", (container_id,))
            found = row.fetchone()
            return self._record(found) if found else None

    def all(self) -> list[SliceRecord]:
        with self._lock:
            rows = self._db.execute(f"SELECT {self._COLUMNS} FROM slices ORDER BY created_ms, id").fetchall()
            allocs: dict[str, list[Allocation]] = {}
            for sid, *a in self._db.execute(
                f"SELECT slice_id, {self._ALLOCATION} FROM allocations ORDER BY slice_id, gpu_index, share"
            ):
                allocs.setdefault(sid, []).append(Allocation(*a))
            return [self._record(r, tuple(allocs.get(r[0], ()))) for r in rows]

    # -- writes (call inside transaction()) ---------------------------------------
    def insert(
        self, container_id: str, request: dict, policy: str, priority: str, whole: bool, owner: str,
        allocations: list[Allocation], kind: OwnerKind = OwnerKind.CONTAINER, member_of: str | None = None,
        workload: Workload = NO_WORKLOAD,
    ) -> SliceRecord:  # fmt: skip
        """Insert a reservation; the record as written (no read back)."""
        rec = SliceRecord(
            uuid.uuid4().hex[:16], container_id, "reserved", dict(request), policy, priority, whole, owner, now_ms(),
            None, None, None, None, None, tuple(allocations), kind, member_of, workload,
        )  # fmt: skip
        self._db.execute(
            "INSERT INTO slices (id, container_id, state, request, policy, priority, whole, owner, created_ms, kind, "
            "member_of, workload_namespace, workload_pod, workload_container) "
            "VALUES (?, ?, 'reserved', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (rec.id, container_id, json.dumps(request), policy, priority, int(whole), owner, rec.created_ms,
             kind.value, member_of, workload.namespace, workload.pod, workload.container),
        )  # fmt: skip
        self._db.executemany(
            f"INSERT INTO allocations (slice_id, {self._ALLOCATION}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(rec.id, a.gpu_index, a.gpu_uuid, a.memory, a.cores, a.share, a.policy, a.priority) for a in allocations],
        )
        return rec

    def bind(self, rec: SliceRecord, pid: int, pid_ns: int, cgroup: str, pid_start: int) -> SliceRecord:
        """Bind a reservation to its container's process; the record as written."""
        bound = dataclasses.replace(
            rec, state="bound", bound_ms=now_ms(), pid=pid, pid_ns=pid_ns, cgroup=cgroup, pid_start=pid_start
        )
        self._db.execute(
            "UPDATE slices SET state='bound', bound_ms=?, pid=?, pid_ns=?, cgroup=?, pid_start=? WHERE id=?",
            (bound.bound_ms, pid, pid_ns, cgroup, pid_start, rec.id),
        )
        return bound

    def resize(self, rec: SliceRecord, allocations: list[Allocation], request: dict) -> SliceRecord:
        for a in allocations:
            self._db.execute(
                "UPDATE allocations SET memory=?, cores=? WHERE slice_id=? AND gpu_uuid=? AND share=?",
                (a.memory, a.cores, rec.id, a.gpu_uuid, a.share),
            )
        self._db.execute("UPDATE slices SET request=? WHERE id=?", (json.dumps(request), rec.id))
        return dataclasses.replace(rec, allocations=tuple(allocations), request=dict(request))

    def delete(self, slice_id: str) -> None:
        self._db.execute("DELETE FROM slices WHERE id=?", (slice_id,))

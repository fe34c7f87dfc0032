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
from pathlib import Path
from typing import TypeVar

from gpuslice import errors
from gpuslice.allocator.records import NO_WORKLOAD, Allocation, OwnerKind, ShareOwner, SliceRecord, Workload

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
    # 4: owners typed all the way: a slice's owner UID is a column (a claim's
    # was read from its key after "claim-"), and each allocation names whose
    # share it is by kind and UID (a share group's held "<uid>/<share>"; its
    # owner's kind is the owner row's, found by that UID). A share group whose
    # owner is gone could charge nothing: it goes, with its members.
    """
ALTER TABLE slices ADD COLUMN uid TEXT NOT NULL DEFAULT '';
UPDATE slices SET uid = substr(container_id, 7) WHERE kind = 'claim' AND container_id LIKE 'claim-%';
UPDATE slices SET uid = container_id WHERE uid = '';
CREATE TABLE typed (
    slice_id TEXT NOT NULL REFERENCES slices(id) ON DELETE CASCADE,
    owner_kind TEXT NOT NULL DEFAULT '',
    owner_uid TEXT NOT NULL DEFAULT '',
    share TEXT NOT NULL DEFAULT '',
    gpu_index INTEGER NOT NULL,
    gpu_uuid TEXT NOT NULL,
    memory INTEGER NOT NULL,
    cores INTEGER NOT NULL,
    policy TEXT NOT NULL DEFAULT '',
    priority TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (slice_id, gpu_uuid, owner_kind, owner_uid, share)
);
INSERT INTO typed
    SELECT a.slice_id, CASE WHEN s.kind IN ('claim', 'devices') THEN s.kind ELSE '' END,
           CASE WHEN s.kind IN ('claim', 'devices') THEN s.uid ELSE '' END,
           a.share, a.gpu_index, a.gpu_uuid, a.memory, a.cores, a.policy, a.priority
    FROM allocations AS a JOIN slices AS s ON s.id = a.slice_id WHERE s.kind != 'shares';
INSERT INTO typed
    SELECT a.slice_id, o.kind, o.uid, substr(a.share, instr(a.share, '/') + 1),
           a.gpu_index, a.gpu_uuid, a.memory, a.cores, a.policy, a.priority
    FROM allocations AS a JOIN slices AS s ON s.id = a.slice_id
    JOIN slices AS o ON o.kind IN ('claim', 'devices') AND o.uid = substr(a.share, 1, instr(a.share, '/') - 1)
    WHERE s.kind = 'shares';
DELETE FROM slices WHERE kind = 'shares'
    AND (SELECT count(*) FROM allocations WHERE slice_id = slices.id)
        != (SELECT count(*) FROM typed WHERE slice_id = slices.id);
DROP TABLE allocations;
ALTER TABLE typed RENAME TO allocations;
CREATE INDEX allocations_by_gpu ON allocations(gpu_uuid);
""",
)
SCHEMA_VERSION = len(MIGRATIONS)


SQLITE_IOERR, SQLITE_FULL = 10, 13  # primary result codes (the low byte of extended ones)


class StoreError(errors.FailedPrecondition):
    """The store cannot be used as it is (a newer schema, a file that is not a store)."""


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
        f"{path}: {what}; the slices it held are unknown. Move it aside to start with an empty store "
        "(the slices' files are kept in the slice files directory), or restore it from a backup"
    )


class SliceStore:
    def __init__(self, path: Path, slices_with_files: Collection[str] = ()) -> None:
        """`slices_with_files`: the slices whose files are on disk; with any,
        a missing store is a lost one, not a first start."""
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        # SQLite would take an empty file for a new store: a store that lost its
        # content must not start as one that holds no slices
        if path.exists() and path.stat().st_size == 0:
            raise _refuse(path, "the slice store is empty (0 bytes), not a store this daemon made")
        if not path.exists() and slices_with_files:
            raise StoreError(
                f"{path}: the slice store is missing, but {len(slices_with_files)} slices have files "
                f"({', '.join(sorted(slices_with_files)[:3])}{', …' if len(slices_with_files) > 3 else ''}): "
                "the slices it held are unknown. Restore it "
                f"(from {path.name}.recovered beside it, written when the daemon saw it go, or a backup), "
                "or move the slice files directory aside to start with an empty store"
            )
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode: a commit survives kill -9 of the daemon (the OS has it);
            # only power loss can drop the last commits, and then every container is gone too.
            self._db.execute("PRAGMA synchronous=NORMAL")
            # a checkpoint every 256 pages (1 MiB) and the log cut back to that size after it: the
            # store stays about a megabyte on disk, whatever the churn (4 MiB and more by default)
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
    _ALLOCATION = "gpu_index, gpu_uuid, memory, cores, share, policy, priority, owner_kind, owner_uid"
    _ORDER = "gpu_index, owner_kind, owner_uid, share"

    @staticmethod
    def _allocation(row: tuple) -> Allocation:
        index, gpu_uuid, memory, cores, share, policy, priority, kind, uid = row
        of = ShareOwner(OwnerKind(kind), uid) if kind else None
        return Allocation(index, gpu_uuid, memory, cores, share, policy, priority, of)

    def _record(self, row: tuple, allocs: tuple[Allocation, ...] | None = None) -> SliceRecord:
        if allocs is None:
            allocs = tuple(
                self._allocation(a)
                for a in self._db.execute(
                    f"SELECT {self._ALLOCATION} FROM allocations WHERE slice_id=? ORDER BY {self._ORDER}", (row[0],)
                )
            )
        return SliceRecord(
            row[0], row[1], row[2], json.loads(row[3]), row[4], row[5], bool(row[6]), row[7], row[8], row[9],
            row[10], row[11], row[12], row[13], allocs, OwnerKind(row[14]), row[15], Workload(*row[16:19]), row[19],
        )  # fmt: skip

    _COLUMNS = (
        "id, container_id, state, request, policy, priority, whole, owner, created_ms, bound_ms, pid, pid_ns, "
        "cgroup, pid_start, kind, member_of, workload_namespace, workload_pod, workload_container, uid"
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
                f"SELECT slice_id, {self._ALLOCATION} FROM allocations ORDER BY slice_id, {self._ORDER}"
            ):
                allocs.setdefault(sid, []).append(self._allocation(tuple(a)))
            return [self._record(r, tuple(allocs.get(r[0], ()))) for r in rows]

    # -- writes (call inside transaction()) ---------------------------------------
    def insert(
        self, container_id: str, request: dict, policy: str, priority: str, whole: bool, owner: str,
        allocations: list[Allocation], kind: OwnerKind = OwnerKind.CONTAINER, member_of: str | None = None,
        workload: Workload = NO_WORKLOAD, uid: str = "",
    ) -> SliceRecord:  # fmt: skip
        """Insert a reservation; the record as written (no read back). `uid`:
        its owner's (a claim's UID); its key where empty."""
        rec = SliceRecord(
            uuid.uuid4().hex[:16], container_id, "reserved", dict(request), policy, priority, whole, owner, now_ms(),
            None, None, None, None, None, tuple(allocations), kind, member_of, workload, uid or container_id,
        )  # fmt: skip
        self._db.execute(
            "INSERT INTO slices (id, container_id, state, request, policy, priority, whole, owner, created_ms, kind, "
            "member_of, workload_namespace, workload_pod, workload_container, uid) "
            "VALUES (?, ?, 'reserved', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (rec.id, container_id, json.dumps(request), policy, priority, int(whole), owner, rec.created_ms,
             kind.value, member_of, workload.namespace, workload.pod, workload.container, rec.uid),
        )  # fmt: skip
        self._db.executemany(
            f"INSERT INTO allocations (slice_id, {self._ALLOCATION}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(rec.id, a.gpu_index, a.gpu_uuid, a.memory, a.cores, a.share, a.policy, a.priority,
              a.of.kind.value if a.of else "", a.of.uid if a.of else "") for a in allocations],
        )  # fmt: skip
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
                "UPDATE allocations SET memory=?, cores=? WHERE slice_id=? AND gpu_uuid=? AND owner_kind=? "
                "AND owner_uid=? AND share=?",
                (
                    a.memory,
                    a.cores,
                    rec.id,
                    a.gpu_uuid,
                    a.of.kind.value if a.of else "",
                    a.of.uid if a.of else "",
                    a.share,
                ),
            )
        self._db.execute("UPDATE slices SET request=? WHERE id=?", (json.dumps(request), rec.id))
        return dataclasses.replace(rec, allocations=tuple(allocations), request=dict(request))

    def delete(self, slice_id: str) -> None:
        self._db.execute("DELETE FROM slices WHERE id=?", (slice_id,))

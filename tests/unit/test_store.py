"""The slice store's schema versions (allocator/store.py): a new store is made
at the current version, an older one is migrated in place, a newer one is
refused with one line."""

from __future__ import annotations

import sqlite3

import pytest

from gpuslice.allocator.store import MIGRATIONS, SCHEMA_VERSION, Allocation, SliceStore, StoreError
from gpuslice.errors import Code


def version(path) -> int:
    with sqlite3.connect(path) as db:
        return db.execute("PRAGMA user_version").fetchone()[0]


def test_a_new_store_is_at_the_current_version_and_keeps_slices(tmp_path):
    store = SliceStore(tmp_path / "state.db")
    store.transaction(lambda s: s.insert("c1", {"gpuslice.io/memory": "1Gi"}, "hard", "high", False, "test",
                                         [Allocation(0, "GPU-0", 1 << 30, 30)]))  # fmt: skip
    store.close()
    assert version(tmp_path / "state.db") == SCHEMA_VERSION
    again = SliceStore(tmp_path / "state.db")
    rec = again.get("c1")
    assert rec is not None and rec.allocations == (Allocation(0, "GPU-0", 1 << 30, 30),) and rec.policy == "hard"


def test_a_store_from_before_versions_were_kept_is_migrated_with_its_rows(tmp_path):
    path = tmp_path / "state.db"
    with sqlite3.connect(path) as db:  # what the daemon wrote before schema versions: version 1's tables, version 0
        db.executescript(MIGRATIONS[0])
        db.execute("INSERT INTO slices (id, container_id, state, request, policy, priority, whole, created_ms) "
                   "VALUES ('s1', 'c1', 'reserved', '{}', 'elastic', 'normal', 0, 1)")  # fmt: skip
    assert version(path) == 0
    store = SliceStore(path)
    assert [r.container_id for r in store.all()] == ["c1"]
    store.close()
    assert version(path) == SCHEMA_VERSION


def test_a_store_from_a_newer_gpuslice_is_refused(tmp_path):
    path = tmp_path / "state.db"
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError) as e:
        SliceStore(path)
    assert str(e.value) == (
        f"{path}: slice store schema version {SCHEMA_VERSION + 1} is newer than this gpuslice knows "
        f"({SCHEMA_VERSION}); run the gpuslice that wrote it"
    )
    assert e.value.code == Code.FAILED_PRECONDITION

"""The slice store's schema versions (allocator/store.py): a new store is made
at the current version, an older one is migrated in place, a newer one is
refused with one line."""

from __future__ import annotations

import sqlite3

import pytest

from gpuslice.allocator.records import NO_WORKLOAD, Allocation, OwnerKind, ShareOwner, Workload
from gpuslice.allocator.store import MIGRATIONS, SCHEMA_VERSION, SliceStore, StoreError
from gpuslice.errors import Code, code_of


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
        db.execute(
            "INSERT INTO slices (id, container_id, state, request, policy, priority, whole, created_ms) "
            "VALUES ('s1', 'c1', 'reserved', '{}', 'elastic', 'normal', 0, 1)"
        )
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
    assert code_of(e.value) == Code.FAILED_PRECONDITION


def test_version_1_owners_become_kinds_and_allocations_become_shares(tmp_path):
    """Version 1 knew a claim's slice by its key's "claim-" prefix and a member
    by a pseudo-annotation naming the claim's key; version 2 has them as
    columns, the member pointing at the claim slice's id."""
    path = tmp_path / "state.db"
    with sqlite3.connect(path) as db:
        db.executescript(MIGRATIONS[0])
        db.execute("PRAGMA user_version = 1")
        rows = [
            ("s1", "c1", '{"gpuslice.io/memory": "1Gi"}'),
            ("s2", "claim-u1", '{"gpuslice.io/memory": "2Gi"}'),
            ("s3", "c2", '{"gpuslice.io/member-of": "claim-u1"}'),
            ("s4", "c3", '{"gpuslice.io/member-of": "claim-gone"}'),
        ]  # a member of no claim: dropped
        db.executemany(
            "INSERT INTO slices (id, container_id, state, request, policy, priority, whole, created_ms) "
            "VALUES (?, ?, 'reserved', ?, 'hard', 'high', 0, 1)",
            rows,
        )
        db.executemany("INSERT INTO allocations VALUES (?, 0, 'GPU-0', ?, 30)", [("s1", 1 << 30), ("s2", 2 << 30)])
    store = SliceStore(path)
    got = {r.container_id: r for r in store.all()}
    assert sorted(got) == ["c1", "c2", "claim-u1"]
    assert (got["c1"].kind, got["claim-u1"].kind, got["c2"].kind) == (
        OwnerKind.CONTAINER,
        OwnerKind.CLAIM,
        OwnerKind.MEMBER,
    )
    assert got["c2"].member_of == "s2" and got["c2"].request == {} and got["c1"].member_of is None
    # share "", the slice's policy; whose share it is, typed (version 4)
    assert got["claim-u1"].allocations == (Allocation(0, "GPU-0", 2 << 30, 30, of=ShareOwner(OwnerKind.CLAIM, "u1")),)
    assert got["claim-u1"].share_owner == ShareOwner(OwnerKind.CLAIM, "u1") and got["c1"].uid == "c1"
    # two shares of one GPU now fit one slice; deleting the claim takes its member's row with it
    store.transaction(lambda s: s.insert("claim-u2", {}, "elastic", "normal", False, "dra", [
        Allocation(1, "GPU-1", 1 << 30, 20, "a", "hard", "high"), Allocation(1, "GPU-1", 1 << 30, 10, "b")],
        OwnerKind.CLAIM))  # fmt: skip
    assert [a.share for a in store.get("claim-u2").allocations] == ["a", "b"]
    store.transaction(lambda s: s.delete("s2"))
    assert sorted(r.container_id for r in store.all()) == ["c1", "claim-u2"]
    # version 3: a slice made before workloads were kept serves none; a new one keeps its own
    assert got["c1"].workload == NO_WORKLOAD and not got["c1"].workload
    who = Workload("team-a", "trainer-0", "main")
    store.transaction(lambda s: s.insert("c3", {}, "elastic", "normal", False, "hook", [], workload=who))
    store.close()
    assert version(path) == SCHEMA_VERSION == 4
    again = SliceStore(path)
    assert again.get("c3").workload == who and again.get("c1").workload == NO_WORKLOAD
    again.close()

"""A store written by gpuslice f0844ec (tests/data/store-f0844ec.db, made by
its own SliceManager: tests/data/make_store_f0844ec.py) is migrated in place:
every owner typed (a claim's UID a column, each share group's allocation
naming its owner by kind and UID, never "<uid>/<share>"), and the daemon
goes on with it: the groups made then are found again by a new container
given the same shares, and releasing an owner takes its groups along."""

from __future__ import annotations

import os
import shutil
import sqlite3

import pytest

from gpuslice.allocator import slices
from gpuslice.allocator.membership import MembershipKey
from gpuslice.allocator.records import OwnerKind, ShareOwner
from gpuslice.allocator.share_groups import ShareEntry
from gpuslice.allocator.store import SCHEMA_VERSION, SliceStore
from gpuslice.inventory import Gpu, Inventory
from tests.harness import REPO

GiB = 1 << 30
A = ShareOwner(OwnerKind.CLAIM, "0a000000-0000-4000-8000-00000000000a")
B = ShareOwner(OwnerKind.CLAIM, "0b000000-0000-4000-8000-00000000000b")
DP = ShareOwner(OwnerKind.DEVICES, "dp-" + "c" * 24)
KEY = MembershipKey(b"\x01" * 32)  # the generator's
GPUS = tuple(
    Gpu(i, f"GPU-{i:08d}-0000-0000-0000-000000000000", "sim", f"0000:0{i}:00.0", 16 * GiB, 0, 0) for i in range(2)
)


@pytest.fixture
def store(tmp_path):  # type: ignore[no-untyped-def]
    path = tmp_path / "state.db"
    shutil.copy(REPO / "tests" / "data" / "store-f0844ec.db", path)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 3  # as f0844ec left it
    s = SliceStore(path)
    yield s
    s.close()


def test_every_owner_is_typed_and_no_name_is_left_to_split(store):
    with sqlite3.connect(store.path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert db.execute("SELECT count(*) FROM allocations WHERE share LIKE '%/%'").fetchone()[0] == 0
    recs = {r.container_id: r for r in store.all()}
    assert len(recs) == 11  # nothing lost
    assert recs["claim-" + A.uid].share_owner == A and recs[DP.uid].share_owner == DP
    assert recs["ctr-1"].share_owner == ShareOwner(OwnerKind.CONTAINER, "ctr-1")
    assert {a.of for a in recs["ctr-1"].allocations} == {None}
    assert [(a.of, a.share) for a in recs["claim-" + A.uid].allocations] == [(A, "s1"), (A, "s2"), (A, "s3")]
    groups = {r.container_id: [(a.of, a.share, a.gpu_index) for a in r.allocations]
              for r in recs.values() if r.kind is OwnerKind.SHARE_GROUP}  # fmt: skip
    assert sorted(groups.values()) == sorted(
        [
            [(A, "s1", 0), (A, "s2", 0)],
            [(A, "s3", 1), (B, "s3", 1)],  # two claims' shares of one ID on one GPU: both kept
            [(DP, "memory", 1)],
        ]
    )
    members = {r.container_id: recs_by_id(recs)[r.member_of].container_id for r in recs.values() if r.member_of}
    assert set(members) == {"pod-a-main", "pod-a-side", "pod-ab", "pod-dp"}
    assert members["pod-a-main"] == members["pod-a-side"]


def recs_by_id(recs):  # type: ignore[no-untyped-def]
    return {r.id: r for r in recs.values()}


def test_the_daemon_goes_on_with_the_migrated_store(store, tmp_path):
    m = slices.SliceManager(store, Inventory("580.0", 13000, GPUS, {}), tmp_path / "files", membership=KEY)
    m.restore()
    before = {r.container_id for r in m.records()}
    refs = m.typed_shares([ShareEntry(A.uid, s, KEY.token(f"claim-share/{A.uid}/{s}")) for s in ("s1", "s2")])
    assert [r.owner for r in refs] == [A, A]
    joined = m.join("pod-a-new", refs, os.getpid())
    group = m.index.by_id[joined.member_of]
    assert group.container_id in before  # the group f0844ec made for these shares, found by its key
    dp = m.typed_shares([ShareEntry(DP.uid, "memory", KEY.token(f"devices/{DP.uid}/memory"))])
    assert [r.owner for r in dp] == [DP]  # the key says whose share it is: no prefix read
    # the claim's shares are booked once (the claims'), the groups book nothing
    tally = m.index.tally[GPUS[1].uuid]
    assert tally.memory == 2 * GiB + GiB + 3 * GiB and tally.cores == 30 + 5
    assert m.release("claim-" + A.uid)
    dp_group = m.index.by_id[m.index.by_container["pod-dp"].member_of].container_id
    # claim A's groups and their members went with it (the one with B's share too); B, the rest stay
    assert {r.container_id for r in m.records()} == {"ctr-1", "claim-" + B.uid, DP.uid, dp_group, "pod-dp"}

"""Owners are typed on the wire as in the store: each Slice carries its kind
as the proto enum of the same name and its owner's UID, and each share names
its owner."""

from __future__ import annotations

import pytest

from gpuslice.allocator.records import Allocation, OwnerKind, ShareOwner, SliceRecord
from gpuslice.allocator.service import slice_message
from gpuslice.allocator.slices import SliceView
from gpuslice.proto import gpuslice_pb2 as pb


def record(kind: OwnerKind, key: str, uid: str, allocs: tuple[Allocation, ...]) -> SliceRecord:
    return SliceRecord("id1", key, "reserved", {}, "elastic", "normal", False, "test", 1, None, None, None, None, None,
                       allocs, kind, None, uid=uid)  # fmt: skip


@pytest.mark.parametrize("kind", list(OwnerKind))
def test_each_kind_is_the_enum_of_its_name_with_its_owners_uid(kind):
    of = ShareOwner(OwnerKind.CLAIM, "u1") if kind in (OwnerKind.CLAIM, OwnerKind.SHARE_GROUP) else None
    uid = "u1" if kind is OwnerKind.CLAIM else "key-1"
    rec = record(kind, "key-1", uid, (Allocation(0, "GPU-0", 1, 2, "s", of=of),))
    m = slice_message(SliceView(rec, 0, 0, "interposer"))
    assert pb.OwnerKind.Name(m.owner_kind) == kind.name and m.kind == kind.value
    assert m.owner_uid == uid
    [g] = m.gpus
    assert (g.owner_kind, g.owner_uid, g.share_id) == ((pb.CLAIM, "u1", "s") if of else (0, "", "s"))

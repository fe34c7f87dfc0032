"""The committed slice records, kept in memory and looked up without SQL: by
key and id, share groups by member and by owner, what each GPU holds, and
bound slices by pid namespace and cgroup."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpuslice.allocator.identity import Identity
from gpuslice.allocator.placement import GpuCapacity
from gpuslice.allocator.records import SHARE_OWNERS, Allocation, OwnerKind, ShareOwner, SliceRecord
from gpuslice.inventory import Gpu


@dataclass
class GpuTally:
    """What the slices on one GPU hold, kept as they change."""

    memory: int = 0
    cores: int = 0
    slices: int = 0
    whole: int = 0  # slices that hold it whole

    def add(self, a: Allocation, whole: bool, sign: int) -> None:
        self.memory += sign * a.memory
        self.cores += sign * a.cores
        self.slices += sign
        self.whole += sign * int(whole)


@dataclass
class Index:
    by_container: dict[str, SliceRecord] = field(default_factory=dict)
    by_id: dict[str, SliceRecord] = field(default_factory=dict)
    owners: dict[ShareOwner, SliceRecord] = field(default_factory=dict)  # claims' and allocations' slices
    members: dict[str, set[str]] = field(default_factory=dict)  # slice id -> its members' container ids
    groups: dict[ShareOwner, set[str]] = field(default_factory=dict)  # owner -> share groups of its shares (keys)
    tally: dict[str, GpuTally] = field(default_factory=dict)
    held: dict[str, int] = field(default_factory=dict)  # GPU UUID -> slices whose files hold it (share groups too)
    # bound slices, oldest first (containers of a pod may share a namespace)
    by_pid_ns: dict[int, list[SliceRecord]] = field(default_factory=dict)
    by_cgroup: dict[str, list[SliceRecord]] = field(default_factory=dict)

    def put(self, rec: SliceRecord) -> None:
        self.drop(rec.container_id)
        self.by_container[rec.container_id] = rec
        self.by_id[rec.id] = rec
        if rec.kind in SHARE_OWNERS:
            self.owners[rec.share_owner] = rec
        if rec.member_of:
            self.members.setdefault(rec.member_of, set()).add(rec.container_id)
        for owner in _grouped(rec):
            self.groups.setdefault(owner, set()).add(rec.container_id)
        for a in rec.allocations if rec.books else ():
            self.tally.setdefault(a.gpu_uuid, GpuTally()).add(a, rec.whole, 1)
        for uuid in rec.file_gpus:
            self.held[uuid] = self.held.get(uuid, 0) + 1
        if rec.state == "bound":
            if rec.pid_ns is not None:
                _insert(self.by_pid_ns.setdefault(rec.pid_ns, []), rec)
            if rec.cgroup:
                _insert(self.by_cgroup.setdefault(rec.cgroup, []), rec)

    def drop(self, container_id: str) -> SliceRecord | None:
        rec = self.by_container.pop(container_id, None)
        if rec is None:
            return None
        del self.by_id[rec.id]
        if self.owners.get(rec.share_owner) is rec:
            del self.owners[rec.share_owner]
        if rec.member_of:
            _remove(self.members, rec.member_of, container_id)
        for owner in _grouped(rec):
            _remove(self.groups, owner, container_id)
        for a in rec.allocations if rec.books else ():
            self.tally[a.gpu_uuid].add(a, rec.whole, -1)
        for uuid in rec.file_gpus:
            self.held[uuid] -= 1
            if not self.held[uuid]:
                del self.held[uuid]
        if rec.state == "bound":
            _remove(self.by_pid_ns, rec.pid_ns, rec)
            _remove(self.by_cgroup, rec.cgroup, rec)
        return rec

    def target(self, rec: SliceRecord) -> SliceRecord:
        """The slice whose files and limits a record's processes use: a
        member's share group, else the record itself."""
        return self.by_id.get(rec.member_of, rec) if rec.member_of else rec

    def bound_slice(self, who: Identity, own: Identity) -> SliceRecord | None:
        """The bound slice whose container this process belongs to: same pid
        namespace (a container's own; where a pod's containers share one, the
        one with the process's cgroup), else same cgroup; never the daemon's
        (`own`). Its target: the slice whose files it charges."""
        if who.pid_ns != own.pid_ns and (recs := self.by_pid_ns.get(who.pid_ns)):
            # containers of a pod that shares its pid namespace: each has its own cgroup
            mine = next((r for r in recs if r.cgroup == who.cgroup), recs[0]) if len(recs) > 1 else recs[0]
            return self.target(mine)
        if who.cgroup not in ("", "/", own.cgroup) and (recs := self.by_cgroup.get(who.cgroup)):
            return self.target(recs[0])
        return None

    def capacities(self, gpus: Iterable[Gpu], exclude: str | None = None) -> list[GpuCapacity]:
        """Each GPU's room as the slices leave it; without slice `exclude` (a
        resize measures against everything but the slice itself)."""
        used = {u: GpuTally(t.memory, t.cores, t.slices, t.whole) for u, t in self.tally.items()}
        rec = self.by_container.get(exclude) if exclude else None
        if rec is not None and rec.books:
            for a in rec.allocations:
                used[a.gpu_uuid].add(a, rec.whole, -1)
        caps = []
        for g in gpus:
            t = used.get(g.uuid, GpuTally())
            caps.append(GpuCapacity(g.index, g.uuid, g.memory_total, t.memory, t.cores, t.slices, t.whole > 0, g.name))
        return caps

    def groups_of(self, owner: ShareOwner) -> list[SliceRecord]:
        """The share groups that hold some of an owner's shares, by key."""
        return [self.by_container[k] for k in sorted(self.groups.get(owner, ()))]


def _grouped(rec: SliceRecord) -> set[ShareOwner]:
    """The owners whose shares a share group holds."""
    return rec.owners() if rec.kind is OwnerKind.SHARE_GROUP else set()


def _insert(recs: list[SliceRecord], rec: SliceRecord) -> None:
    bisect.insort(recs, rec, key=lambda r: (r.created_ms, r.id))


def _remove(by: dict, key: object, item: object) -> None:
    items = by.get(key)
    if items and item in items:
        items.remove(item)
        if not items:
            del by[key]

"""The daemon's operations on slices: reserve, bind, release, resize, and each
slice's shared files, on top of the slice store (SQLite) and placement.

The store is the durable truth; the manager keeps what it committed in memory
too (allocator/slice_index.py), so that no read, and no placement, goes to
SQLite: a call costs the same at 2,000 slices as at one. Every change commits
first and updates the memory after, under one lock. The manager is the only
writer of slice files."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from gpuslice import constants, errors
from gpuslice import request as requests
from gpuslice.allocator import identity, metrics, share_groups, slice_files
from gpuslice.allocator.driver_limits import DriverLimits, Enforcement
from gpuslice.allocator.membership import MembershipKey
from gpuslice.allocator.placement import GpuCapacity, ShareRequest, place, place_shares, resized
from gpuslice.allocator.records import (
    NO_WORKLOAD,
    SHARE_OWNERS,
    Allocation,
    OwnerKind,
    ShareOwner,
    SliceRecord,
    Workload,
)
from gpuslice.allocator.share_groups import Conflict, ShareEntry, ShareRef
from gpuslice.allocator.slice_files import GpuLimit, SliceFiles
from gpuslice.allocator.slice_index import Index
from gpuslice.allocator.store import SliceStore, now_ms
from gpuslice.inventory import Inventory

log = logging.getLogger(__name__)


class NoSlice(errors.NotFound):
    """The process belongs to no container with a slice."""


class SliceFull(errors.ResourceExhausted):
    """The slice has no free process slot."""


@dataclass(frozen=True)
class Attachment:
    """A process attached to a slice: the slice whose files it charges (a
    member's share group), and its slot there."""

    slice: SliceRecord
    files: SliceFiles
    slot: int


@dataclass(frozen=True)
class SliceView:
    record: SliceRecord
    memory_used: int
    processes: int
    enforcement: str  # "driver+interposer" where the driver enforces the memory limit too
    driver_side: tuple[int, ...] = ()  # per GPU of its files: what the driver holds beyond the charges
    over_limit: tuple[int, ...] = ()  # per GPU of its files: bytes past its memory limit (the driver's doing)


class SliceManager:
    def __init__(
        self, store: SliceStore, inventory: Inventory, files_dir: Path, oversubscription: float = 1.0,
        context_reserve: int = 0, driver_limits: DriverLimits | None = None,
        membership: MembershipKey | None = None, proc: identity.ProcFs = identity.PROC,
    ) -> None:  # fmt: skip
        self.store = store
        self.membership = membership or MembershipKey.ephemeral()
        self.inventory = inventory
        self.files_dir = files_dir
        self.oversubscription = oversubscription
        self.context_reserve = context_reserve
        self.proc = proc  # how a process's identity is read (/proc; a test's stand-in)
        self.files: dict[str, SliceFiles] = {}
        self.index = Index()
        self._lock = threading.RLock()
        self.on_release: list = []  # callbacks(slice_id) for the process watcher
        files_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.own = identity.of_pid(os.getpid(), proc)  # the daemon's own: no container's
        self.driver = Enforcement(driver_limits, self.own.cgroup)  # the driver's limits, where it has them

    # -- capacity ------------------------------------------------------------------
    def capacities(self, exclude: str | None = None) -> list[GpuCapacity]:
        with self._lock:
            return self.index.capacities(self.inventory.gpus, exclude)

    # -- files -----------------------------------------------------------------------
    def limits_of(self, slice_id: str) -> list[GpuLimit]:
        """A slice's limits per GPU, in its files' order, from its record (none
        once it is released)."""
        with self._lock:
            rec = self.index.by_id.get(slice_id)
            return self._limits(rec) if rec else []

    def _limits(self, rec: SliceRecord) -> list[GpuLimit]:
        limits = slice_files.per_gpu(rec.allocations, rec.policy, rec.priority)
        return [dataclasses.replace(g, context_reserve=self.context_reserve) for g in limits]

    def _files_for(self, rec: SliceRecord) -> SliceFiles:
        with self._lock:
            rec = self.index.target(rec)
            f = self.files.get(rec.id)
            if f is None:
                f = self.files[rec.id] = SliceFiles(self.files_dir, rec.id)
            f.write_limits(self._limits(rec))
            return f

    def restore(self) -> None:
        """After a (re)start: files for every slice in the store, stale files
        gone, and the driver's limits on running containers applied again."""
        keep = set()
        stored = self.store.all()
        for rec in stored:
            self.index.put(rec)
        for rec in stored:
            if rec.kind in SHARE_OWNERS and not self.index.members.get(rec.id):
                continue  # its shares are charged through share groups (members from before groups use its files)
            keep.add(self.index.target(rec).id)
            try:
                self._files_for(rec)
            except OSError as e:  # e.g. a full disk: the slice stays; a Reserve of it again makes them
                log.error("slice %s of container %s: cannot make its files: %s", rec.id, rec.container_id, e)
                continue
            self.driver.apply(rec)
        stale = slice_files.set_aside(self.files_dir, keep)
        if stale:
            aside, names = self.files_dir / "orphaned", ", ".join(sorted({p.stem for p in stale}))
            log.warning("%d slice files of slices not in the store moved to %s: %s", len(stale), aside, names)

    # -- operations ----------------------------------------------------------------------
    @metrics.counted(OwnerKind.CONTAINER.value)
    def reserve(
        self, container_id: str, asked: requests.Parsed, owner: str = "", workload: Workload = NO_WORKLOAD
    ) -> SliceRecord:
        """A container's slice, placed here; `asked` is its request, parsed once
        by the caller (requests.read); `workload`, the pod's container it serves."""
        if not container_id:
            raise errors.InvalidArgument("container_id: must not be empty")
        req, ours = asked.request, asked.annotations
        with self._lock:
            existing = self.index.by_container.get(container_id)
            if existing:
                if existing.kind is not OwnerKind.CONTAINER or existing.request != ours:
                    raise Conflict(
                        f"container {container_id} already holds slice {existing.id} with other annotations "
                        f"{existing.request}"
                    )
                if existing.id not in self.files:  # a Reserve that failed half-way (full disk) is finished now
                    self._files_or_nothing(existing)
                return existing
            placed = place(
                req, self.capacities(), self.inventory.distance, self.oversubscription, self.inventory.same_numa
            )
            allocs = [Allocation(p.index, p.uuid, p.memory, p.cores) for p in placed]
            rec = self.store.transaction(
                lambda store: store.insert(
                    container_id,
                    ours,
                    req.policy.value,
                    req.priority.value,
                    req.whole_gpus,
                    owner,
                    allocs,
                    workload=workload,
                )
            )
            self.index.put(rec)
            self._files_or_nothing(rec)
        return rec

    @metrics.counted(OwnerKind.CLAIM.value)
    def reserve_claim(
        self, uid: str, shares: list[ShareRequest], owner: str = "", workload: Workload = NO_WORKLOAD
    ) -> SliceRecord:
        """A DRA claim's slice, on exactly the GPUs and of exactly the sizes the
        scheduler allocated: each share its own memory, cores, policy and
        priority. Idempotent for the same shares; all or nothing."""
        if not uid:
            raise errors.InvalidArgument("claim uid: must not be empty")
        who = ShareOwner(OwnerKind.CLAIM, uid)
        return self._reserve_shares(who, constants.claim_slice_key(uid), shares, owner, workload)

    @metrics.counted(OwnerKind.DEVICES.value)
    def reserve_devices(
        self, key: str, share: ShareRequest, owner: str = "", workload: Workload = NO_WORKLOAD
    ) -> SliceRecord:
        """A device plugin allocation's slice: the units of one resource the
        kubelet gave one container, on their GPU (share.share names the
        resource). Idempotent for the same key and size."""
        if not constants.is_devices_slice_key(key):
            raise errors.InvalidArgument(f"allocation key {key!r}: accepted {constants.DEVICES_SLICE_KEY_FORMAT}")
        return self._reserve_shares(ShareOwner(OwnerKind.DEVICES, key), key, [share], owner, workload)

    def _reserve_shares(
        self, who: ShareOwner, key: str, shares: list[ShareRequest], owner: str, workload: Workload
    ) -> SliceRecord:
        if not shares:
            raise errors.InvalidArgument(f"{who}: no share to reserve")
        with self._lock:
            placed = place_shares(str(who), shares, self.capacities(exclude=key), self.oversubscription)
            allocs = [
                Allocation(cap.index, cap.uuid, m, c, s.share, s.policy.value, s.priority.value, who)
                for s, cap, m, c in placed
            ]
            existing = self.index.by_container.get(key)
            if existing:  # the same shares again: measured against its own room
                if existing.share_owner != who or existing.allocations != tuple(allocs):
                    raise Conflict(f"{who} already holds slice {existing.id} of other shares")
                return existing
            policy, priority = share_groups.agreed(allocs)
            whole = all(s.request().whole_gpus for s in shares)

            def insert(store: SliceStore) -> SliceRecord:
                return store.insert(key, {}, policy, priority, whole, owner, allocs, who.kind, None, workload, who.uid)

            rec = self.store.transaction(insert)
            self.index.put(rec)  # no files: its containers charge its shares through share groups (join)
        return rec

    def _files_or_nothing(self, rec: SliceRecord) -> None:
        """The slice's files, or no slice at all (the row goes too)."""
        try:
            self._files_for(rec)
        except OSError as e:
            self.release(rec.container_id)  # all or nothing: no row without its files
            raise errors.ResourceExhausted(
                f"container {rec.container_id}: cannot make the slice's files in {self.files_dir}: "
                f"{e.strerror or e}; nothing was reserved"
            ) from e

    def _process(self, container_id: str, pid: int) -> identity.Identity:
        try:
            return identity.of_pid(pid, self.proc)
        except identity.NoSuchProcess as e:
            raise errors.InvalidArgument(f"pid {pid}: no such process to bind container {container_id} to") from e

    def bind(self, container_id: str, pid: int) -> SliceRecord:
        who = self._process(container_id, pid)
        with self._lock:
            rec = self.index.by_container.get(container_id)
            if rec is None:
                raise errors.NotFound(f"container {container_id} has no reservation; Reserve it first")
            if rec.state == "bound":
                if rec.pid == pid and rec.pid_start == who.start_time:
                    return rec
                raise Conflict(f"container {container_id} is already bound to pid {rec.pid}")
            bound = self.store.transaction(
                lambda store: store.bind(rec, who.pid, who.pid_ns, who.cgroup, who.start_time)
            )
            self.index.put(bound)
            self.driver.apply(bound)
            return bound

    def typed_shares(self, entries: list[ShareEntry]) -> list[ShareRef]:
        """A container's share entries, each with the owner its key proves."""
        return share_groups.typed(self.membership, entries)

    def _given_where_asked(self, container_id: str, given: list[Allocation], choice: requests.GpuChoice) -> None:
        """The device plugin's GPUs must be ones the container may be given:
        where the plugin could not tell which container it allocated for, the
        container's start is where its choice is held."""
        if not choice:
            return
        names = {g.uuid: g.name for g in self.inventory.gpus}
        for a in given:
            why = choice.refusal(a.gpu_index, a.gpu_uuid, names.get(a.gpu_uuid, ""))
            if why:
                raise errors.FailedPrecondition(
                    f"container {container_id}: the device plugin gave it GPU {a.gpu_index} ({a.gpu_uuid}), {why}; "
                    "it runs only on a GPU it may be given"
                )

    @metrics.counted(OwnerKind.MEMBER.value)
    def join(self, container_id: str, shares: list[ShareRef], pid: int, compute: share_groups.Compute | None = None,
             workload: Workload = NO_WORKLOAD) -> SliceRecord:  # fmt: skip
        """A container given shares, bound to the share group of exactly those
        shares: its processes charge them together with the other containers
        given the same ones (and see no other share of their owners).
        `compute`: the container's own policy and priority, for device plugin
        shares (a claim's shares carry their own)."""
        who = self._process(container_id, pid)
        if not shares:
            raise errors.InvalidArgument(f"container {container_id}: no claim share to join")
        with self._lock:
            wanted = share_groups.named(self.index, self.membership, shares)
            share_groups.one_device_slice(container_id, wanted)
            if compute is not None:
                self._given_where_asked(container_id, wanted, compute.choice)
                wanted = [share_groups.with_compute(a, compute) for a in wanted]
            key = share_groups.group_key(wanted)
            existing = self.index.by_container.get(container_id)
            if existing is not None:
                group = self.index.by_container.get(key)
                if group is not None and existing.member_of == group.id and existing.pid == pid:
                    return existing
                raise Conflict(f"container {container_id} already holds slice {existing.id}")
            share_groups.no_other_group(self.index, key, wanted)

            def tx(store: SliceStore) -> tuple[SliceRecord | None, SliceRecord]:
                group = self.index.by_container.get(key)
                made = None
                if group is None:  # labelled with the workload of the container that first joins it
                    policy, priority = share_groups.agreed(wanted)
                    made = group = store.insert(key, {}, policy, priority, False, share_groups.group_label(wanted),
                                                wanted, OwnerKind.SHARE_GROUP, workload=workload)  # fmt: skip
                member = store.bind(
                    store.insert(container_id, {}, group.policy, group.priority, False, f"member of {key}", [],
                                 OwnerKind.MEMBER, group.id, workload),
                    who.pid, who.pid_ns, who.cgroup, who.start_time,
                )  # fmt: skip
                return made, member

            made, member = self.store.transaction(tx)
            if made is not None:
                self.index.put(made)
                self._files_or_nothing(made)
            self.index.put(member)
            return member

    def release(self, container_id: str) -> bool:
        with self._lock:
            rec = self.index.by_container.get(container_id)
            if rec is None:
                return False
            if rec.kind is OwnerKind.MEMBER:  # a member holds no files or capacity of its own
                group = self.index.by_id.get(rec.member_of or "")
                if (
                    group is None
                    or group.kind is not OwnerKind.SHARE_GROUP
                    or (self.index.members.get(group.id) != {container_id})
                ):
                    group = None  # others still charge it (or an owner's slice from before share groups)
                # the last member of a share group takes it along: its shares are free for another set
                gone = group.id if group else rec.id
                self.store.transaction(lambda store: store.delete(gone))
                self.index.drop(container_id)
                log.info("container %s left slice %s", container_id, rec.member_of)
                if group:
                    self._forget(group)
                return True
            # an owner's share groups and their members go with it (the store deletes members' rows with them)
            groups = [rec] + (self.index.groups_of(rec.share_owner) if rec.kind in SHARE_OWNERS else [])

            def tx(store: SliceStore) -> None:
                for r in groups:
                    store.delete(r.id)

            self.store.transaction(tx)
            for r in groups:
                self._forget(r)
        log.info("released slice %s of container %s", rec.id, container_id)
        return True

    def _forget(self, rec: SliceRecord) -> None:
        """A slice whose row is gone: its members, files and driver limits too."""
        for member in sorted(self.index.members.get(rec.id, ())):
            self.index.drop(member)
        self.index.drop(rec.container_id)
        f = self.files.pop(rec.id, None)
        if f:
            f.remove()
        self.driver.clear(rec)
        for cb in self.on_release:
            cb(rec.id)

    def resize(self, container_id: str, annotations: dict[str, str]) -> SliceRecord:
        allowed = {requests.MEMORY, requests.CORES}
        changes = {k: v for k, v in annotations.items() if k in allowed}
        if not changes or set(annotations) - allowed:
            raise errors.InvalidArgument(
                f"resize takes {requests.MEMORY} and/or {requests.CORES}, got {sorted(annotations)}"
            )

        def tx(store: SliceStore) -> SliceRecord:
            rec = self.index.by_container.get(container_id)
            if rec is None:
                raise errors.NotFound(f"container {container_id} has no slice")
            if rec.kind is not OwnerKind.CONTAINER:
                raise errors.FailedPrecondition(
                    f"{container_id} is a {rec.kind.value} slice: its size is its owner's (a claim's, as allocated)"
                )
            merged = {**rec.request, **changes}
            req = requests.parse(merged)
            assert req is not None
            f = self.files.get(rec.id)
            used = f.used() if f else [0] * len(rec.allocations)
            caps = self.capacities(exclude=container_id)
            return store.resize(rec, resized(req, rec.allocations, used, caps, self.oversubscription), merged)

        with self._lock:
            rec = self.store.transaction(tx)
            self.index.put(rec)
            self._files_for(rec)
            if rec.id in self.driver:
                self.driver.apply(rec)
        return rec

    def get(self, container_id: str) -> SliceView:
        rec = self.index.by_container.get(container_id)
        if rec is None:
            raise errors.NotFound(f"container {container_id} has no slice")
        return self.view(rec)

    def records(self) -> list[SliceRecord]:
        """Every slice, oldest first (as the store lists them)."""
        with self._lock:
            recs = list(self.index.by_container.values())
        return sorted(recs, key=lambda r: (r.created_ms, r.id))

    def share_keys(self, owner: SliceRecord) -> dict[str, str]:
        return share_groups.keys(self.membership, owner)

    def views(self) -> list[SliceView]:
        return [self.view(r) for r in self.records()]

    def counters(self, rec: SliceRecord) -> list[tuple[int, int]]:
        """Per GPU of its slice files: launches that waited for budget, and
        allocations refused at the limit; none for a slice without files."""
        f = self.files.get(rec.id)
        return [(f.gate_waits(g), f.refusals(g)) for g in range(f.gpu_count())] if f else []

    def view(self, rec: SliceRecord) -> SliceView:
        f = self.files.get(rec.id)
        how = "driver+interposer" if rec.id in self.driver else "interposer"
        if f is None:
            return SliceView(rec, 0, 0, how)
        gpus = range(f.gpu_count())
        used = f.used()
        extra = tuple(f.driver_side(g) for g in gpus)
        over = tuple(max(0, used[g] - f.memory_limit(g)) for g in gpus)
        return SliceView(rec, sum(used), len(f.slot_pids()), how, extra, over)

    # -- containers' processes ------------------------------------------------------------
    def slice_of(self, who: identity.Identity) -> SliceRecord | None:
        with self._lock:
            return self.index.bound_slice(who, self.own)

    def attach(self, who: identity.Identity) -> Attachment:
        """A process of a container with a slice takes a slot in the slice's
        files (its container's, or a member's claim's)."""
        rec = self.slice_of(who)
        if rec is None:
            raise NoSlice("this process belongs to no container with a GPU slice")
        with self._lock:
            files = self.files.get(rec.id)
            slot = files.claim_slot(who.pid) if files else None
        if files is None or slot is None:
            raise SliceFull(f"slice {rec.id} has no free process slot")
        return Attachment(rec, files, slot)

    def gpus_held(self) -> list[str]:
        """The UUIDs of the GPUs that slices hold."""
        with self._lock:  # kept as slices come and go: the reconciler asks every period
            return list(self.index.held)

    def container_files_of(self, pid: int) -> SliceFiles | None:
        """The files of the slice whose container the process (this host's pid)
        is in, by the rule a process attaches by, for a process in a pid
        namespace not the daemon's (a container's: a host process's cgroup is
        shared by its whole session); None for any other, or one gone."""
        try:
            who = identity.of_pid(pid, self.proc)
        except (identity.NoSuchProcess, OSError):
            return None
        if who.pid_ns == self.own.pid_ns:
            return None
        rec = self.slice_of(who)
        if rec is None:
            return None
        with self._lock:
            return self.files.get(rec.id)

    def attached(self) -> list[tuple[SliceFiles, int, int]]:
        """(files, slot, pid) of every process attached to a slice, as the files
        say (after a restart, those attached before it)."""
        with self._lock:
            files = list(self.files.values())
        return [(f, slot, pid) for f in files for slot, pid in f.slot_pids().items()]

    def sweep(self, reservation_timeout: float) -> list[str]:
        """Release slices whose container is gone and reservations never bound."""
        gone = []
        for r in self.records():
            # a claim's slice lives until the kubelet unprepares the claim, however long unused
            if (r.state == "bound" and not identity.alive(r.pid or 0, r.pid_start or -1, self.proc)) or (
                r.state == "reserved"
                and r.kind not in (*SHARE_OWNERS, OwnerKind.SHARE_GROUP)
                and now_ms() - r.created_ms > reservation_timeout * 1000
            ):
                gone.append(r.container_id)
        for cid in gone:
            log.info("reclaiming slice of container %s (gone or never bound)", cid)
            self.release(cid)
        return gone

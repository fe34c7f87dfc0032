"""The daemon's operations on slices: reserve, bind, release, resize, and each
slice's shared files, on top of the slice store (SQLite) and placement.

The store is the durable truth; the manager keeps what it committed in memory
too (records by container, tallies per GPU, bound slices by pid namespace and
cgroup), so that no read, and no placement, goes to SQLite: a call costs the
same at 2,000 slices as at one.  Every change commits first and updates the
memory after, under one lock."""

from __future__ import annotations

import bisect
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from gpuslice import constants, errors
from gpuslice import request as requests
from gpuslice.allocator import identity
from gpuslice.allocator.placement import GpuCapacity, NoRoom, demand, fits, place
from gpuslice.allocator.slice_files import GpuLimit, SliceFiles
from gpuslice.allocator.store import Allocation, SliceRecord, SliceStore, now_ms
from gpuslice.inventory import Inventory
from gpuslice.units import format_bytes

log = logging.getLogger(__name__)


class Conflict(errors.FailedPrecondition):
    """The request contradicts what the store holds (e.g. another pid, other limits)."""


@dataclass(frozen=True)
class SliceView:
    record: SliceRecord
    memory_used: int
    processes: int
    enforcement: str  # "driver+interposer" where the driver enforces the memory limit too


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
    """The committed records, looked up without SQL."""

    by_container: dict[str, SliceRecord] = field(default_factory=dict)
    tally: dict[str, GpuTally] = field(default_factory=dict)
    # bound slices, oldest first (containers of a pod may share a namespace)
    by_pid_ns: dict[int, list[SliceRecord]] = field(default_factory=dict)
    by_cgroup: dict[str, list[SliceRecord]] = field(default_factory=dict)

    def put(self, rec: SliceRecord) -> None:
        self.drop(rec.container_id)
        self.by_container[rec.container_id] = rec
        for a in rec.allocations:
            self.tally.setdefault(a.gpu_uuid, GpuTally()).add(a, rec.whole, 1)
        if rec.state == "bound":
            if rec.pid_ns is not None:
                _insert(self.by_pid_ns.setdefault(rec.pid_ns, []), rec)
            if rec.cgroup:
                _insert(self.by_cgroup.setdefault(rec.cgroup, []), rec)

    def drop(self, container_id: str) -> SliceRecord | None:
        rec = self.by_container.pop(container_id, None)
        if rec is None:
            return None
        for a in rec.allocations:
            self.tally[a.gpu_uuid].add(a, rec.whole, -1)
        if rec.state == "bound":
            _remove(self.by_pid_ns, rec.pid_ns, rec)
            _remove(self.by_cgroup, rec.cgroup, rec)
        return rec


def _insert(recs: list[SliceRecord], rec: SliceRecord) -> None:
    bisect.insort(recs, rec, key=lambda r: (r.created_ms, r.id))


def _remove(by: dict, key: object, rec: SliceRecord) -> None:
    recs = by.get(key)
    if recs and rec in recs:
        recs.remove(rec)
        if not recs:
            del by[key]


def _ours(annotations: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in annotations.items() if k.startswith(requests.PREFIX)}


# A member: a container using a DRA claim's slice. Its record holds no capacity;
# its request names the claim's slice, whose files its processes charge.
MEMBER_OF = requests.PREFIX + "member-of"


def is_claim(rec: SliceRecord) -> bool:
    return rec.container_id.startswith(constants.CLAIM_SLICE_PREFIX) and MEMBER_OF not in rec.request


class SliceManager:
    def __init__(
        self, store: SliceStore, inventory: Inventory, files_dir: Path, oversubscription: float = 1.0,
        context_reserve: int = 0, driver_limits=None,
    ) -> None:  # fmt: skip
        self.store = store
        self.inventory = inventory
        self.files_dir = files_dir
        self.oversubscription = oversubscription
        self.context_reserve = context_reserve
        self.driver_limits = driver_limits  # DriverLimits, or None without NVML's cgroup limits
        self.enforced: dict[str, str] = {}  # slice id -> cgroup path the driver limits
        self.files: dict[str, SliceFiles] = {}
        self.index = Index()
        self._lock = threading.RLock()
        self.on_release: list = []  # callbacks(slice_id) for the process watcher
        files_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.own_pid_ns = identity.of_pid(os.getpid()).pid_ns
        self.own_cgroup = identity.of_pid(os.getpid()).cgroup

    # -- capacity ------------------------------------------------------------------
    def capacities(self, exclude: str | None = None) -> list[GpuCapacity]:
        with self._lock:
            used = {u: GpuTally(t.memory, t.cores, t.slices, t.whole) for u, t in self.index.tally.items()}
            rec = self.index.by_container.get(exclude) if exclude else None
            for a in rec.allocations if rec else ():  # a resize measures against everything but the slice itself
                used[a.gpu_uuid].add(a, rec.whole, -1)  # type: ignore[union-attr]
        caps = []
        for g in self.inventory.gpus:
            t = used.get(g.uuid, GpuTally())
            caps.append(GpuCapacity(g.index, g.uuid, g.memory_total, t.memory, t.cores, t.slices, t.whole > 0))
        return caps

    # -- files -----------------------------------------------------------------------
    def target(self, rec: SliceRecord) -> SliceRecord:
        """The slice whose files and limits a record's processes use: a member's
        claim slice, else the record itself."""
        claim = rec.request.get(MEMBER_OF)
        return self.index.by_container.get(claim, rec) if claim else rec

    def _files_for(self, rec: SliceRecord) -> SliceFiles:
        with self._lock:
            rec = self.target(rec)
            f = self.files.get(rec.id)
            if f is None:
                f = self.files[rec.id] = SliceFiles(self.files_dir, rec.id)
            hard = rec.policy == requests.ComputePolicy.HARD.value
            f.write_limits(
                [
                    GpuLimit(a.gpu_uuid, a.memory, a.cores, hard, self.context_reserve, rec.priority)
                    for a in rec.allocations
                ]
            )
            return f

    def _driver_limit(self, rec: SliceRecord) -> None:
        """Have the driver enforce the slice's memory on the container's cgroup
        too (hard = soft = the slice's memory), where it can."""
        dl = self.driver_limits
        if dl is None or rec.state != "bound" or rec.cgroup == self.own_cgroup:
            return
        uuids = [a.gpu_uuid for a in rec.allocations]
        ns = dl.cgroup_path(rec.cgroup)
        if ns is None or not dl.any_supported(uuids):
            log.info("slice %s: no driver limit (cgroup %s)", rec.id, rec.cgroup)
            return
        if all(dl.set(a.gpu_uuid, ns, a.memory, a.memory) for a in rec.allocations):
            self.enforced[rec.id] = ns
            log.info("slice %s: the driver limits %s", rec.id, ns)
        else:
            self._clear_driver_limit(rec)

    def _clear_driver_limit(self, rec: SliceRecord) -> None:
        ns = self.enforced.pop(rec.id, None)
        if ns and self.driver_limits:
            for a in rec.allocations:
                self.driver_limits.clear(a.gpu_uuid, ns)

    def restore(self) -> None:
        """After a (re)start: files for every slice in the store, stale files
        gone, and the driver's limits on running containers applied again."""
        keep = set()
        for rec in self.store.all():
            self.index.put(rec)
            keep.add(rec.id)
            try:
                self._files_for(rec)
            except OSError as e:  # e.g. a full disk: the slice stays; a Reserve of it again makes them
                log.error("slice %s of container %s: cannot make its files: %s", rec.id, rec.container_id, e)
                continue
            self._driver_limit(rec)
        stale = [p for p in self.files_dir.iterdir() if p.suffix in (".limits", ".usage") and p.stem not in keep]
        if stale:
            # files of slices the store does not hold: kept aside, and said, not deleted
            aside = self.files_dir / "orphaned"
            aside.mkdir(mode=0o700, exist_ok=True)
            for p in stale:
                p.replace(aside / p.name)
            log.warning(
                "%d slice files of slices not in the store moved to %s: %s",
                len(stale), aside, ", ".join(sorted({p.stem for p in stale})),
            )  # fmt: skip

    # -- operations ----------------------------------------------------------------------
    def reserve(self, container_id: str, annotations: dict[str, str], owner: str = "") -> SliceRecord:
        if not container_id:
            raise errors.InvalidArgument("container_id: must not be empty")
        ours = _ours(annotations)
        req = requests.parse(ours)
        if req is None:
            raise errors.InvalidArgument(f"no {requests.PREFIX}* annotation: the container asks for no GPU")

        with self._lock:
            existing = self.index.by_container.get(container_id)
            if existing:
                if existing.request != ours:
                    raise Conflict(
                        f"container {container_id} already holds slice {existing.id} with other annotations "
                        f"{existing.request}"
                    )
                if existing.id not in self.files:  # a Reserve that failed half-way (full disk) is finished now
                    self._files_or_nothing(existing)
                return existing
            placed = place(req, self.capacities(), self.inventory.distance, self.oversubscription)
            allocs = [Allocation(p.index, p.uuid, p.memory, p.cores) for p in placed]
            rec = self.store.transaction(
                lambda store: store.insert(
                    container_id, ours, req.policy.value, req.priority.value, req.whole_gpus, owner, allocs
                )
            )
            self.index.put(rec)
            self._files_or_nothing(rec)
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

    @staticmethod
    def _process(container_id: str, pid: int) -> identity.Identity:
        try:
            return identity.of_pid(pid)
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
            self._driver_limit(bound)
            return bound

    def join(self, container_id: str, claim_slice: str, pid: int) -> SliceRecord:
        """A container of a DRA claim, bound to the claim's slice: its processes
        share the claim's memory and compute with the claim's other containers."""
        who = self._process(container_id, pid)
        with self._lock:
            claim = self.index.by_container.get(claim_slice)
            if claim is None or not is_claim(claim):
                raise errors.NotFound(
                    f"the slice of claim {claim_slice.removeprefix(constants.CLAIM_SLICE_PREFIX)} is not on this node "
                    "(the DRA plugin prepares it before the pod's containers start)"
                )
            existing = self.index.by_container.get(container_id)
            if existing is not None:
                if existing.request.get(MEMBER_OF) == claim_slice and existing.pid == pid:
                    return existing
                raise Conflict(f"container {container_id} already holds slice {existing.id}")
            member = self.store.transaction(
                lambda store: store.bind(
                    store.insert(container_id, {MEMBER_OF: claim_slice}, claim.policy, claim.priority, False,
                                 f"member of {claim_slice}", []),
                    who.pid, who.pid_ns, who.cgroup, who.start_time,
                )
            )  # fmt: skip
            self.index.put(member)
            return member

    def release(self, container_id: str) -> bool:
        with self._lock:
            rec = self.index.by_container.get(container_id)
            if rec is None:
                return False
            if is_claim(rec):  # its members go with it
                for member in [
                    r for r in self.index.by_container.values() if r.request.get(MEMBER_OF) == rec.container_id
                ]:
                    self.release(member.container_id)
            if MEMBER_OF in rec.request:  # a member holds no files or capacity of its own
                self.store.transaction(lambda store: store.delete(rec.id))
                self.index.drop(container_id)
                log.info("container %s left %s", container_id, rec.request[MEMBER_OF])
                return True
            self.store.transaction(lambda store: store.delete(rec.id))
            self.index.drop(container_id)
            f = self.files.pop(rec.id, None)
            if f:
                f.remove()
            self._clear_driver_limit(rec)
            for cb in self.on_release:
                cb(rec.id)
        log.info("released slice %s of container %s", rec.id, container_id)
        return True

    def resize(self, container_id: str, annotations: dict[str, str]) -> SliceRecord:
        changes = _ours(annotations)
        allowed = {requests.MEMORY, requests.CORES}
        if not changes or set(changes) - allowed:
            raise errors.InvalidArgument(
                f"resize takes {requests.MEMORY} and/or {requests.CORES}, got {sorted(annotations)}"
            )

        def tx(store: SliceStore) -> SliceRecord:
            rec = self.index.by_container.get(container_id)
            if rec is None:
                raise errors.NotFound(f"container {container_id} has no slice")
            merged = {**rec.request, **changes}
            req = requests.parse(merged)
            assert req is not None
            caps = {c.uuid: c for c in self.capacities(exclude=container_id)}
            f = self.files.get(rec.id)
            used = f.used() if f else [0] * len(rec.allocations)
            new = []
            for i, a in enumerate(rec.allocations):
                cap = caps[a.gpu_uuid]
                if not fits(req, cap, self.oversubscription):
                    raise NoRoom(f"GPU {a.gpu_index} ({a.gpu_uuid}) has no room for the new size")
                memory, cores = demand(req, cap)
                if i < len(used) and memory < used[i]:
                    raise Conflict(
                        f"slice uses {format_bytes(used[i])} on GPU {a.gpu_index}, more than the new limit "
                        f"{format_bytes(memory)}"
                    )
                new.append(Allocation(a.gpu_index, a.gpu_uuid, memory, cores))
            return store.resize(rec, new, merged)

        with self._lock:
            rec = self.store.transaction(tx)
            self.index.put(rec)
            self._files_for(rec)
            if rec.id in self.enforced:
                self._driver_limit(rec)
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

    def views(self) -> list[SliceView]:
        return [self.view(r) for r in self.records()]

    def view(self, rec: SliceRecord) -> SliceView:
        f = self.files.get(rec.id)
        how = "driver+interposer" if rec.id in self.enforced else "interposer"
        if f is None:
            return SliceView(rec, 0, 0, how)
        return SliceView(rec, sum(f.used()), len(f.slot_pids()), how)

    # -- containers' processes ------------------------------------------------------------
    def slice_of(self, who: identity.Identity) -> SliceRecord | None:
        """The bound slice whose container this process belongs to: same pid
        namespace (a container's own; where a pod's containers share one, the
        one with the process's cgroup), else same cgroup; never the daemon's."""
        with self._lock:
            if who.pid_ns != self.own_pid_ns and (recs := self.index.by_pid_ns.get(who.pid_ns)):
                # containers of a pod that shares its pid namespace: each has its own cgroup
                mine = next((r for r in recs if r.cgroup == who.cgroup), recs[0]) if len(recs) > 1 else recs[0]
                return self.target(mine)
            if who.cgroup not in ("", "/", self.own_cgroup) and (recs := self.index.by_cgroup.get(who.cgroup)):
                return self.target(recs[0])
        return None

    def sweep(self, reservation_timeout: float) -> list[str]:
        """Release slices whose container is gone and reservations never bound."""
        gone = []
        for r in self.records():
            # a claim's slice lives until the kubelet unprepares the claim, however long unused
            if (r.state == "bound" and not identity.alive(r.pid or 0, r.pid_start or -1)) or (
                r.state == "reserved" and not is_claim(r) and now_ms() - r.created_ms > reservation_timeout * 1000
            ):
                gone.append(r.container_id)
        for cid in gone:
            log.info("reclaiming slice of container %s (gone or never bound)", cid)
            self.release(cid)
        return gone

"""The daemon's operations on slices: reserve, bind, release, resize, and each
slice's shared files, on top of the slice store (SQLite) and placement.

The store is the durable truth; the manager keeps what it committed in memory
too (records by container, tallies per GPU, bound slices by pid namespace and
cgroup), so that no read, and no placement, goes to SQLite: a call costs the
same at 2,000 slices as at one.  Every change commits first and updates the
memory after, under one lock."""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import logging
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

from gpuslice import constants, errors
from gpuslice import request as requests
from gpuslice.allocator import identity, metrics, slice_files
from gpuslice.allocator.membership import MembershipKey, claim_share, devices_share
from gpuslice.allocator.placement import CannotFit, GpuCapacity, NoRoom, demand, describe, fits, place
from gpuslice.allocator.slice_files import GpuLimit, SliceFiles
from gpuslice.allocator.store import NO_WORKLOAD, Allocation, OwnerKind, SliceRecord, SliceStore, Workload, now_ms
from gpuslice.inventory import Inventory
from gpuslice.units import format_bytes

log = logging.getLogger(__name__)


# owners whose slices containers join with their devices' shares (ShareRef)
JOINABLE = (OwnerKind.CLAIM, OwnerKind.DEVICES)
_DEVICES_KEY = re.compile(re.escape(constants.DEVICES_SLICE_PREFIX) + r"[0-9a-f]{24}\Z")


def owner_key(uid: str) -> str:
    """The key of the slice a share's owner holds: a device plugin
    allocation's is its own key, a claim's is made from its UID."""
    return uid if uid.startswith(constants.DEVICES_SLICE_PREFIX) else constants.claim_slice_key(uid)


def subject(uid: str, share: str) -> str:
    """What a share's membership key is made over."""
    return devices_share(uid, share) if uid.startswith(constants.DEVICES_SLICE_PREFIX) else claim_share(uid, share)


def uid_of(rec: SliceRecord) -> str:
    """The owner's UID in its shares' names: a claim's UID, an allocation's key."""
    if rec.kind is OwnerKind.DEVICES:
        return rec.container_id
    return rec.container_id.removeprefix(constants.CLAIM_SLICE_PREFIX)


class Conflict(errors.FailedPrecondition):
    """The request contradicts what the store holds (e.g. another pid, other limits)."""


class NoSlice(errors.NotFound):
    """The process belongs to no container with a slice."""


class SliceFull(errors.ResourceExhausted):
    """The slice has no free process slot."""


@dataclass(frozen=True)
class ShareRequest:
    """One share of a claim as the scheduler placed it: a GPU by index, and
    what of it (memory None: the whole memory, or in proportion to cores;
    cores None: no guaranteed share; both None: the whole GPU)."""

    gpu_index: int
    memory: int | None = None
    cores: int | None = None
    policy: requests.ComputePolicy = requests.ComputePolicy.ELASTIC
    priority: requests.Priority = requests.Priority.NORMAL
    share: str = ""  # tells shares on one GPU apart (the DRA share ID)

    def request(self) -> requests.SliceRequest:
        memory = None if self.memory is None else requests.MemoryLimit(bytes=self.memory)
        return requests.SliceRequest(1, memory, self.cores, self.policy, self.priority)


@dataclass(frozen=True)
class ShareRef:
    """A share of a prepared claim that a container was given (its claim
    device's entry), with the share's membership key from that device."""

    claim: str
    share: str
    token: str = ""

    def __str__(self) -> str:
        return f"{self.claim}/{self.share}"


def ledger_key(shares: list[str]) -> str:
    """The key of the ledger that charges exactly these claim shares together."""
    digest = hashlib.sha256("\n".join(sorted(shares)).encode()).hexdigest()[:24]
    return f"shares-{digest}"


@dataclass(frozen=True)
class Attachment:
    """A process attached to a slice: the slice whose files it charges (a
    member's claim slice), and its slot there."""

    slice: SliceRecord
    files: SliceFiles
    slot: int


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
    by_id: dict[str, SliceRecord] = field(default_factory=dict)
    members: dict[str, set[str]] = field(default_factory=dict)  # ledger id -> its members' container ids
    ledgers: dict[str, set[str]] = field(default_factory=dict)  # claim uid -> its shares' ledgers (container ids)
    tally: dict[str, GpuTally] = field(default_factory=dict)
    # bound slices, oldest first (containers of a pod may share a namespace)
    by_pid_ns: dict[int, list[SliceRecord]] = field(default_factory=dict)
    by_cgroup: dict[str, list[SliceRecord]] = field(default_factory=dict)

    def put(self, rec: SliceRecord) -> None:
        self.drop(rec.container_id)
        self.by_container[rec.container_id] = rec
        self.by_id[rec.id] = rec
        if rec.member_of:
            self.members.setdefault(rec.member_of, set()).add(rec.container_id)
        for uid in _claims_of(rec):
            self.ledgers.setdefault(uid, set()).add(rec.container_id)
        for a in rec.allocations if rec.books else ():
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
        del self.by_id[rec.id]
        if rec.member_of:
            _remove(self.members, rec.member_of, container_id)
        for uid in _claims_of(rec):
            _remove(self.ledgers, uid, container_id)
        for a in rec.allocations if rec.books else ():
            self.tally[a.gpu_uuid].add(a, rec.whole, -1)
        if rec.state == "bound":
            _remove(self.by_pid_ns, rec.pid_ns, rec)
            _remove(self.by_cgroup, rec.cgroup, rec)
        return rec


def _claims_of(rec: SliceRecord) -> set[str]:
    """The claims (UIDs) whose shares a ledger charges: its allocations' shares are '<uid>/<share>'."""
    return {a.share.split("/", 1)[0] for a in rec.allocations} if rec.kind is OwnerKind.SHARES else set()


def _agreed(allocs: list[Allocation]) -> tuple[str, str]:
    """A slice's own policy and priority: its shares' where they agree (each share keeps its own)."""
    policies, priorities = {a.policy for a in allocs}, {a.priority for a in allocs}
    policy = policies.pop() if len(policies) == 1 else requests.ComputePolicy.ELASTIC.value
    priority = priorities.pop() if len(priorities) == 1 else requests.Priority.NORMAL.value
    return policy, priority


def _one_device_slice(container_id: str, wanted: dict[str, Allocation]) -> None:
    """A container's device plugin shares make one slice: memory and cores on
    one GPU (memory asked: a share of compute without memory could hold
    nothing), or whole GPUs only, never both and never with a claim's."""
    devices = {n: a for n, a in wanted.items() if n.startswith(constants.DEVICES_SLICE_PREFIX)}
    if not devices:
        return
    kinds = {n.rsplit("/", 1)[1] for n in devices}
    partial = {a.gpu_uuid for n, a in devices.items() if not n.endswith("/gpu")}
    said = f"container {container_id}"
    if len(devices) != len(wanted):
        raise errors.InvalidArgument(f"{said}: gpuslice.io/* extended resources and a DRA claim together; use one")
    if "gpu" in kinds and kinds != {"gpu"}:
        raise errors.InvalidArgument(
            f"{said}: gpuslice.io/gpu with gpuslice.io/memory or cores; ask whole GPUs or a slice"
        )
    if len(partial) > 1:
        raise errors.FailedPrecondition(
            f"{said}: its gpuslice.io/memory and gpuslice.io/cores lie on GPUs {', '.join(sorted(partial))}; a slice "
            "lies on one GPU (the device plugin refuses such a pod at admission; this one was allocated otherwise)"
        )
    if kinds == {"cores"}:
        raise errors.InvalidArgument(f"{said}: gpuslice.io/cores without gpuslice.io/memory; ask both in its limits")


def _with_compute(a: Allocation, name: str, compute: tuple[requests.ComputePolicy, requests.Priority]) -> Allocation:
    """A device plugin share with the container's policy and priority (a claim's share keeps its own)."""
    if not name.startswith(constants.DEVICES_SLICE_PREFIX):
        return a
    # the policy rules a share of compute: a memory share holds none, and stays elastic
    policy = compute[0].value if name.endswith("/cores") else a.policy
    return dataclasses.replace(a, policy=policy, priority=compute[1].value)


def _insert(recs: list[SliceRecord], rec: SliceRecord) -> None:
    bisect.insort(recs, rec, key=lambda r: (r.created_ms, r.id))


def _remove(by: dict, key: object, item: object) -> None:
    items = by.get(key)
    if items and item in items:
        items.remove(item)
        if not items:
            del by[key]


def _per_gpu(rec: SliceRecord) -> list[GpuLimit]:
    """The slice's limits, one per GPU: shares on one GPU add up (hard if any
    of them is, at the highest of their priorities)."""
    order = list(requests.Priority)  # high, normal, low
    merged: dict[str, GpuLimit] = {}
    for a in rec.allocations:
        hard = (a.policy or rec.policy) == requests.ComputePolicy.HARD.value
        priority = a.priority or rec.priority
        if (m := merged.get(a.gpu_uuid)) is None:
            merged[a.gpu_uuid] = GpuLimit(a.gpu_uuid, a.memory, a.cores, hard, 0, priority)
        else:
            best = min(m.priority, priority, key=lambda p: order.index(requests.Priority(p)))
            merged[a.gpu_uuid] = GpuLimit(a.gpu_uuid, m.memory_limit + a.memory, min(100, m.cores + a.cores),
                                          m.hard or hard, 0, best)  # fmt: skip
    return list(merged.values())


class SliceManager:
    def __init__(
        self, store: SliceStore, inventory: Inventory, files_dir: Path, oversubscription: float = 1.0,
        context_reserve: int = 0, driver_limits=None, membership: MembershipKey | None = None,
    ) -> None:  # fmt: skip
        self.store = store
        self.membership = membership or MembershipKey.ephemeral()
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
        return self.index.by_id.get(rec.member_of, rec) if rec.member_of else rec

    def limits_of(self, slice_id: str) -> list[GpuLimit]:
        """A slice's limits per GPU, in its files' order, from its record (none
        once it is released)."""
        with self._lock:
            rec = self.index.by_id.get(slice_id)
            return self._limits(rec) if rec else []

    def _limits(self, rec: SliceRecord) -> list[GpuLimit]:
        return [dataclasses.replace(g, context_reserve=self.context_reserve) for g in _per_gpu(rec)]

    def _files_for(self, rec: SliceRecord) -> SliceFiles:
        with self._lock:
            rec = self.target(rec)
            f = self.files.get(rec.id)
            if f is None:
                f = self.files[rec.id] = SliceFiles(self.files_dir, rec.id)
            f.write_limits(self._limits(rec))
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
        stored = self.store.all()
        for rec in stored:
            self.index.put(rec)
        for rec in stored:
            if rec.kind in JOINABLE and not self.index.members.get(rec.id):
                continue  # its shares are charged through ledgers (members of one made before kept its files)
            keep.add(self.target(rec).id)
            try:
                self._files_for(rec)
            except OSError as e:  # e.g. a full disk: the slice stays; a Reserve of it again makes them
                log.error("slice %s of container %s: cannot make its files: %s", rec.id, rec.container_id, e)
                continue
            self._driver_limit(rec)
        stale = [p for sid, paths in slice_files.on_disk(self.files_dir).items() if sid not in keep for p in paths]
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
    @metrics.counted(OwnerKind.CONTAINER.value)
    def reserve(self, container_id: str, asked: requests.Parsed, owner: str = "",
                workload: Workload = NO_WORKLOAD) -> SliceRecord:  # fmt: skip
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
            placed = place(req, self.capacities(), self.inventory.distance, self.oversubscription)
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
    def reserve_claim(self, uid: str, shares: list[ShareRequest], owner: str = "",
                      workload: Workload = NO_WORKLOAD) -> SliceRecord:  # fmt: skip
        """A DRA claim's slice, on exactly the GPUs and of exactly the sizes the
        scheduler allocated: each share its own memory, cores, policy and
        priority. Idempotent for the same shares; all or nothing."""
        if not uid:
            raise errors.InvalidArgument("claim uid: must not be empty")
        key = constants.claim_slice_key(uid)
        return self._reserve_joinable(OwnerKind.CLAIM, key, f"claim {uid}", shares, owner, workload)

    @metrics.counted(OwnerKind.DEVICES.value)
    def reserve_devices(self, key: str, share: ShareRequest, owner: str = "",
                        workload: Workload = NO_WORKLOAD) -> SliceRecord:  # fmt: skip
        """A device plugin allocation's slice: the units of one resource the
        kubelet gave one container, on their GPU (share.share names the
        resource). Idempotent for the same key and size."""
        if not _DEVICES_KEY.match(key):
            raise errors.InvalidArgument(
                f"allocation key {key!r}: accepted {constants.DEVICES_SLICE_PREFIX} and 24 lowercase hex digits"
            )
        return self._reserve_joinable(OwnerKind.DEVICES, key, f"allocation {key}", [share], owner, workload)

    def _reserve_joinable(self, kind: OwnerKind, key: str, what: str, shares: list[ShareRequest],
                          owner: str, workload: Workload) -> SliceRecord:  # fmt: skip
        if not shares:
            raise errors.InvalidArgument(f"{what}: no share to reserve")
        with self._lock:
            allocs = self._claim_allocations(what, shares, exclude=key)  # the same shares again: its own room
            existing = self.index.by_container.get(key)
            if existing:
                if existing.kind is not kind or existing.allocations != tuple(allocs):
                    raise Conflict(f"{what} already holds slice {existing.id} of other shares")
                return existing
            policy, priority = _agreed(allocs)
            whole = all(s.request().whole_gpus for s in shares)
            rec = self.store.transaction(
                lambda store: store.insert(key, {}, policy, priority, whole, owner, allocs, kind, workload=workload)
            )
            self.index.put(rec)  # no files: its containers charge its shares through ledgers (join)
        return rec

    def _claim_allocations(self, what: str, shares: list[ShareRequest], exclude: str) -> list[Allocation]:
        """The shares as allocations, after checking that each GPU exists and
        that what the claim takes of it fits beside what others hold."""
        caps = {c.index: c for c in self.capacities(exclude)}
        by_gpu: dict[int, list[ShareRequest]] = {}
        for s in shares:
            if s.gpu_index not in caps:
                have = ", ".join(str(i) for i in sorted(caps))
                raise CannotFit(f"{what}: no GPU {s.gpu_index} on this node; it has {have}")
            by_gpu.setdefault(s.gpu_index, []).append(s)
        allocs = []
        for index, on_gpu in sorted(by_gpu.items()):
            cap = caps[index]
            if len({s.share for s in on_gpu}) != len(on_gpu) or "/" in "".join(s.share for s in on_gpu):
                raise errors.InvalidArgument(
                    f"{what}: two shares of GPU {index} with one share ID, or a share ID with '/'"
                )
            asked = [s.request() for s in on_gpu]
            wanted = [demand(r, cap) for r in asked]
            whole = any(r.whole_gpus for r in asked)
            memory, cores = sum(m for m, _ in wanted), sum(c for _, c in wanted)
            total = requests.SliceRequest() if whole else requests.SliceRequest(1, requests.MemoryLimit(memory), cores)
            empty = GpuCapacity(cap.index, cap.uuid, cap.memory_total)
            if (whole and len(on_gpu) > 1) or not fits(total, empty, self.oversubscription):
                raise CannotFit(f"request needs {format_bytes(memory)} per GPU, more than any GPU holds")
            if not fits(total, cap, self.oversubscription):
                what = "a whole GPU" if whole else f"{format_bytes(memory)} and {cores} cores"
                raise NoRoom(f"no room for {what}: {describe([cap], self.oversubscription)}")
            allocs += [
                Allocation(index, cap.uuid, m, c, s.share, s.policy.value, s.priority.value)
                for s, (m, c) in zip(on_gpu, wanted, strict=True)
            ]
        return sorted(allocs, key=lambda a: (a.gpu_index, a.share))

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

    @metrics.counted(OwnerKind.MEMBER.value)
    def join(self, container_id: str, shares: list[ShareRef], pid: int,
             compute: tuple[requests.ComputePolicy, requests.Priority] | None = None,
             workload: Workload = NO_WORKLOAD) -> SliceRecord:  # fmt: skip
        """A container given claim devices, bound to the ledger of exactly those
        shares: its processes charge them together with the other containers
        given the same ones (and see no other share of the claim). `compute`:
        the container's own policy and priority, for device plugin shares
        (a claim's shares carry their own)."""
        who = self._process(container_id, pid)
        if not shares:
            raise errors.InvalidArgument(f"container {container_id}: no claim share to join")
        with self._lock:
            wanted = self._claim_shares(shares)
            _one_device_slice(container_id, wanted)
            if compute is not None:
                wanted = {n: _with_compute(a, n, compute) for n, a in wanted.items()}
            key = ledger_key(list(wanted))
            existing = self.index.by_container.get(container_id)
            if existing is not None:
                ledger = self.index.by_container.get(key)
                if ledger is not None and existing.member_of == ledger.id and existing.pid == pid:
                    return existing
                raise Conflict(f"container {container_id} already holds slice {existing.id}")
            self._no_other_ledger(key, set(wanted))

            def tx(store: SliceStore) -> tuple[SliceRecord | None, SliceRecord]:
                ledger = self.index.by_container.get(key)
                made = None
                if ledger is None:
                    made = ledger = self._insert_ledger(store, key, wanted, workload)
                member = store.bind(
                    store.insert(container_id, {}, ledger.policy, ledger.priority, False, f"member of {key}", [],
                                 OwnerKind.MEMBER, ledger.id, workload),
                    who.pid, who.pid_ns, who.cgroup, who.start_time,
                )  # fmt: skip
                return made, member

            made, member = self.store.transaction(tx)
            if made is not None:
                self.index.put(made)
                self._files_or_nothing(made)
            self.index.put(member)
            return member

    def _claim_shares(self, refs: list[ShareRef]) -> dict[str, Allocation]:
        """The shares the refs name ('<owner>/<share>': its allocation), each
        reserved here: a claim's (DRA) or an allocation's (device plugin)."""
        found: dict[str, Allocation] = {}
        for ref in refs:
            devices = ref.claim.startswith(constants.DEVICES_SLICE_PREFIX)
            what = "allocation" if devices else "claim"
            # before anything is looked up: a forged entry learns nothing, not even whether the owner is here
            if not self.membership.admits(subject(ref.claim, ref.share), ref.token):
                raise errors.FailedPrecondition(
                    f"{what} share {ref}: the container was not given its device (the entry lacks the share's key, "
                    f"which only the {'device plugin' if devices else 'claim'}'s answer carries)"
                )
            claim = self.index.by_container.get(owner_key(ref.claim))
            if claim is None or claim.kind not in JOINABLE:
                raise errors.NotFound(
                    f"the slice of {what} {ref.claim} is not on this node "
                    f"(the {'device plugin reserves' if devices else 'DRA plugin prepares'} it before the pod's "
                    "containers start)"
                )
            named = [a for a in claim.allocations if a.share == ref.share]
            if not named:
                raise errors.NotFound(f"{what} {ref.claim} has no share {ref.share} on this node")
            for a in named:
                found[f"{ref.claim}/{a.share}"] = a
        return found

    def _no_other_ledger(self, key: str, wanted: set[str]) -> None:
        """A share is charged through one ledger at a time: two containers given
        overlapping but different sets of shares cannot both hold them exactly."""
        for uid in sorted({name.split("/", 1)[0] for name in wanted}):
            claim = self.index.by_container[owner_key(uid)]
            if self.index.members.get(claim.id):
                # members joined before ledgers (an upgrade) charge the claim's own files, all its shares
                others = [(claim, {f"{uid}/{a.share}" for a in claim.allocations})]
            else:
                ledgers = [self.index.by_container[k] for k in sorted(self.index.ledgers.get(uid, ())) if k != key]
                others = [(r, {a.share for a in r.allocations}) for r in ledgers]
            for rec, held in others:
                overlap = sorted(wanted & held)
                if overlap:
                    users = ", ".join(sorted(self.index.members.get(rec.id, ())))
                    raise Conflict(
                        f"claim share {overlap[0]} is in use by container(s) {users} with other shares of the "
                        "claim; give containers that share a claim either the same requests of it or requests "
                        "that do not overlap"
                    )

    def _insert_ledger(self, store: SliceStore, key: str, wanted: dict[str, Allocation],
                       workload: Workload) -> SliceRecord:  # fmt: skip
        """The ledger of the shares `wanted`, labelled with the workload of the
        container that first joins it (its memory use is charged here)."""
        copies = [dataclasses.replace(a, share=name) for name, a in sorted(wanted.items())]
        copies.sort(key=lambda a: (a.gpu_index, a.share))
        policy, priority = _agreed(copies)
        claims = sorted({name.split("/", 1)[0] for name in wanted})
        return store.insert(key, {}, policy, priority, False, f"shares of claim {', '.join(claims)}", copies,
                            OwnerKind.SHARES, workload=workload)  # fmt: skip

    def release(self, container_id: str) -> bool:
        with self._lock:
            rec = self.index.by_container.get(container_id)
            if rec is None:
                return False
            if rec.kind is OwnerKind.MEMBER:  # a member holds no files or capacity of its own
                ledger = self.index.by_id.get(rec.member_of or "")
                if (
                    ledger is None
                    or ledger.kind is not OwnerKind.SHARES
                    or (self.index.members.get(ledger.id) != {container_id})
                ):
                    ledger = None  # others still charge it (or a claim's slice from before ledgers)
                # the last member of a ledger takes it along: its shares are free for another set
                gone = ledger.id if ledger else rec.id
                self.store.transaction(lambda store: store.delete(gone))
                self.index.drop(container_id)
                log.info("container %s left slice %s", container_id, rec.member_of)
                if ledger:
                    self._forget(ledger)
                return True
            # a claim's ledgers and members go with it (the store deletes members' rows with their slice's)
            ledgers = [rec] + (self._ledgers_of(rec) if rec.kind in JOINABLE else [])

            def tx(store: SliceStore) -> None:
                for r in ledgers:
                    store.delete(r.id)

            self.store.transaction(tx)
            for r in ledgers:
                self._forget(r)
        log.info("released slice %s of container %s", rec.id, container_id)
        return True

    def _ledgers_of(self, claim: SliceRecord) -> list[SliceRecord]:
        uid = uid_of(claim)
        return [self.index.by_container[k] for k in sorted(self.index.ledgers.get(uid, ()))]

    def _forget(self, rec: SliceRecord) -> None:
        """A slice whose row is gone: its members, files and driver limits too."""
        for member in sorted(self.index.members.get(rec.id, ())):
            self.index.drop(member)
        self.index.drop(rec.container_id)
        f = self.files.pop(rec.id, None)
        if f:
            f.remove()
        self._clear_driver_limit(rec)
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

    def share_keys(self, owner: SliceRecord) -> dict[str, str]:
        """A claim's (or allocation's) membership key per share, for the devices that give them."""
        uid = uid_of(owner)
        return {a.share: self.membership.token(subject(uid, a.share)) for a in owner.allocations}

    def views(self) -> list[SliceView]:
        return [self.view(r) for r in self.records()]

    def counters(self, rec: SliceRecord) -> list[tuple[int, int]]:
        """Per GPU of its slice files: launches that waited for budget, and
        allocations refused at the limit; none for a slice without files."""
        f = self.files.get(rec.id)
        return [(f.gate_waits(g), f.refusals(g)) for g in range(f.gpu_count())] if f else []

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
            if (r.state == "bound" and not identity.alive(r.pid or 0, r.pid_start or -1)) or (
                r.state == "reserved"
                and r.kind not in (*JOINABLE, OwnerKind.SHARES)
                and now_ms() - r.created_ms > reservation_timeout * 1000
            ):
                gone.append(r.container_id)
        for cid in gone:
            log.info("reclaiming slice of container %s (gone or never bound)", cid)
            self.release(cid)
        return gone

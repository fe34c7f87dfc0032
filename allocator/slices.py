"""The daemon's operations on slices: reserve, bind, release, resize, and each
slice's shared files, on top of the slice store (SQLite) and placement."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from gpuslice import errors
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


def _ours(annotations: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in annotations.items() if k.startswith(requests.PREFIX)}


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
        self._lock = threading.RLock()
        self.on_release: list = []  # callbacks(slice_id) for the process watcher
        files_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.own_pid_ns = identity.of_pid(os.getpid()).pid_ns
        self.own_cgroup = identity.of_pid(os.getpid()).cgroup

    # -- capacity ------------------------------------------------------------------
    def capacities(self, exclude: str | None = None) -> list[GpuCapacity]:
        used = self.store.usage_by_gpu()
        if exclude:  # a resize measures against everything but the slice itself
            rec = self.store.get(exclude)
            for a in rec.allocations if rec else ():
                m, c, n, w = used[a.gpu_uuid]
                used[a.gpu_uuid] = (m - a.memory, c - a.cores, n - 1, w and n > 1)
        return [
            GpuCapacity(g.index, g.uuid, g.memory_total, *used.get(g.uuid, (0, 0, 0, False)))
            for g in self.inventory.gpus
        ]

    # -- files -----------------------------------------------------------------------
    def files_snapshot(self) -> dict[str, SliceFiles]:
        """The slices' shared files as they are now (for the compute controller)."""
        with self._lock:
            return dict(self.files)

    def _files_for(self, rec: SliceRecord) -> SliceFiles:
        with self._lock:
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
            self._files_for(rec)
            self._driver_limit(rec)
            keep.add(rec.id)
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

        def tx(store: SliceStore) -> SliceRecord:
            existing = store.get(container_id)
            if existing:
                if existing.request != ours:
                    raise Conflict(
                        f"container {container_id} already holds slice {existing.id} with other annotations "
                        f"{existing.request}"
                    )
                return existing
            placed = place(req, self.capacities(), self.inventory.distance, self.oversubscription)
            allocs = [Allocation(p.index, p.uuid, p.memory, p.cores) for p in placed]
            store.insert(container_id, ours, req.policy.value, req.priority.value, req.whole_gpus, owner, allocs)
            return store.get(container_id)  # type: ignore[return-value]

        with self._lock:
            existed = self.store.get(container_id) is not None
            rec = self.store.transaction(tx)
            try:
                self._files_for(rec)
            except OSError as e:
                if not existed:  # all or nothing: no row without its files
                    self.release(container_id)
                raise errors.ResourceExhausted(
                    f"container {container_id}: cannot make the slice's files in {self.files_dir}: "
                    f"{e.strerror or e}; nothing was reserved"
                ) from e
        return rec

    def bind(self, container_id: str, pid: int) -> SliceRecord:
        try:
            who = identity.of_pid(pid)
        except identity.NoSuchProcess as e:
            raise errors.InvalidArgument(f"pid {pid}: no such process to bind container {container_id} to") from e

        def tx(store: SliceStore) -> SliceRecord:
            rec = store.get(container_id)
            if rec is None:
                raise errors.NotFound(f"container {container_id} has no reservation; Reserve it first")
            if rec.state == "bound":
                if rec.pid == pid and rec.pid_start == who.start_time:
                    return rec
                raise Conflict(f"container {container_id} is already bound to pid {rec.pid}")
            store.bind(container_id, who.pid, who.pid_ns, who.cgroup, who.start_time)
            return store.get(container_id)  # type: ignore[return-value]

        with self._lock:
            rec = self.store.transaction(tx)
            self._driver_limit(rec)
            return rec

    def release(self, container_id: str) -> bool:
        with self._lock:
            rec = self.store.transaction(lambda store: store.delete(container_id))
            if rec is None:
                return False
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
            rec = store.get(container_id)
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
            store.resize(rec.id, new, merged)
            return store.get(container_id)  # type: ignore[return-value]

        with self._lock:
            rec = self.store.transaction(tx)
            self._files_for(rec)
            if rec.id in self.enforced:
                self._driver_limit(rec)
        return rec

    def get(self, container_id: str) -> SliceView:
        rec = self.store.get(container_id)
        if rec is None:
            raise errors.NotFound(f"container {container_id} has no slice")
        return self.view(rec)

    def views(self) -> list[SliceView]:
        return [self.view(r) for r in self.store.all()]

    def view(self, rec: SliceRecord) -> SliceView:
        f = self.files.get(rec.id)
        how = "driver+interposer" if rec.id in self.enforced else "interposer"
        if f is None:
            return SliceView(rec, 0, 0, how)
        return SliceView(rec, sum(f.used()), len(f.slot_pids()), how)

    # -- containers' processes ------------------------------------------------------------
    def slice_of(self, who: identity.Identity) -> SliceRecord | None:
        """The bound slice whose container this process belongs to: same pid
        namespace (a container's own), else same cgroup; never the daemon's."""
        bound = [r for r in self.store.all() if r.state == "bound"]
        if who.pid_ns != self.own_pid_ns:
            for r in bound:
                if r.pid_ns == who.pid_ns:
                    return r
        if who.cgroup not in ("", "/", self.own_cgroup):
            for r in bound:
                if r.cgroup == who.cgroup:
                    return r
        return None

    def sweep(self, reservation_timeout: float) -> list[str]:
        """Release slices whose container is gone and reservations never bound."""
        gone = []
        for r in self.store.all():
            if (r.state == "bound" and not identity.alive(r.pid or 0, r.pid_start or -1)) or (
                r.state == "reserved" and now_ms() - r.created_ms > reservation_timeout * 1000
            ):
                gone.append(r.container_id)
        for cid in gone:
            log.info("reclaiming slice of container %s (gone or never bound)", cid)
            self.release(cid)
        return gone

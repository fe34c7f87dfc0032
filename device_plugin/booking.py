"""The plugin's decisions, shared by its three resources' services: which
units a container should get (GetPreferredAllocation), booking them
(Allocate), and giving back what the kubelet no longer holds (reconcile)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gpuslice import errors, inventory
from gpuslice.client import AllocatorClient
from gpuslice.device_plugin import admission, allocation, preference
from gpuslice.device_plugin import units as u
from gpuslice.device_plugin.admission import Admitting, Held
from gpuslice.device_plugin.node_view import NodeApi, PodResources
from gpuslice.device_plugin.preference import Partner
from gpuslice.proto import gpuslice_pb2 as pb
from gpuslice.proto import kubelet_deviceplugin_v1beta1_pb2 as dp

log = logging.getLogger(__name__)

PARTNER_S = 2.0  # a container's resources are allocated back to back; older is another container's
GRACE_S = 5.0  # an allocation this young may not be in the kubelet's books yet (its Allocate just returned)


class Steering:
    """What was allocated last: the GPU a container's next resource is
    steered to when the container cannot be identified (preference.py)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: Partner | None = None
        self._lock = threading.Lock()

    def allocated(self, resource: str, gpu: str) -> None:
        with self._lock:
            self._last = Partner(resource, gpu, self._clock())

    def partner(self) -> Partner | None:
        with self._lock:
            last = self._last
        return last if last and self._clock() - last.at <= PARTNER_S else None


class Booking:
    def __init__(self, daemon: AllocatorClient, kubelet: PodResources | None, api: NodeApi | None,
                 steering: Steering | None = None) -> None:  # fmt: skip
        self.daemon = daemon
        self.kubelet = kubelet
        self.api = api
        self.steering = steering or Steering()
        self.lock = threading.Lock()  # the kubelet admits one pod at a time; so does the plugin
        self.changed: list[Callable[[], None]] = []  # ListAndWatch's notify, per resource
        # GetPreferredAllocation's finding, for the Allocate that follows it at once (one read of the node, not two)
        self._found: tuple[str, int, float, Admitting | None] | None = None

    def _identify(self, resource: str, size: int, reuse: bool = False) -> tuple[Admitting | None, Held | None]:
        if self.kubelet is None or self.api is None:
            return None, None
        found, self._found = self._found, None
        if reuse and found and found[:2] == (resource, size) and time.monotonic() - found[2] <= PARTNER_S:
            return found[3], None  # Allocate right after its GetPreferredAllocation: nothing has changed since
        try:
            held = self.kubelet.held()
            who = admission.identify(resource, size, self.api.pending(), held)
        except errors.GpusliceError as e:
            log.warning(
                "cannot tell which container asks %d %s (%s): steering by the last allocation", size, resource, e
            )
            return None, None
        if who is None:
            log.info("%d %s: no single pending container matches; steering by the last allocation", size, resource)
        self._found = (resource, size, time.monotonic(), who)
        return who, held

    def prefer(self, resource: str, available: list[str], must_include: list[str], size: int) -> list[str]:
        """The units to take, all on one GPU (whole GPUs: on GPUs the container
        may be given); raises with the refusal line."""
        with self.lock:
            who, held = (None, None) if must_include else self._identify(resource, size)
            if who is not None and held is not None and resource != u.GPU:
                ok, line = admission.fitting(who, held, self._named(who))
                free = preference.free_by_gpu(available)
                for gpu in ok:
                    if len(free.get(gpu, [])) >= size:
                        return free[gpu][:size]
                self._found = None  # refused: no Allocate follows
                raise errors.ResourceExhausted(line)
            if who is not None and (out := admission.refusals(who, u.by_gpu(available), self._named(who))):
                available = [d for d in available if u.parse(d).gpu not in out]
                if len(u.by_gpu(available)) < size:
                    self._found = None
                    why = "; ".join(f"{g}: {r}" for g, r in sorted(out.items()))
                    left = len(u.by_gpu(available))
                    raise errors.ResourceExhausted(
                        f"container {who.name} asks {size} whole GPUs; {left} free it may be given ({why})"
                    )
            if resource == u.GPU:  # whole GPUs: as many as asked, the closest set
                return preference.prefer_whole(available, must_include, size, self._apart())
            return preference.prefer(resource, available, must_include, size, self.steering.partner())

    def _apart(self) -> preference.Apart:
        """How far apart two GPUs are, by the daemon's view of the node's links."""
        inv = self.daemon.inventory()
        index = {g.uuid: g.index for g in inv.gpus}
        links = {frozenset((link.a, link.b)): link for link in inv.links}

        def apart(a: str, b: str) -> tuple[int, int]:
            link = links.get(frozenset((index.get(a, -1), index.get(b, -2))))
            level, nvlink = (link.pcie, link.nvlinks > 0) if link else ("unknown", False)
            return (0 if inventory.one_numa_node(level) else 1), inventory.link_distance(level, nvlink)

        return apart

    def _named(self, who: Admitting) -> dict[str, tuple[int, str]]:
        """Each GPU's index and name by UUID, where the container has a GPU choice to hold them against."""
        if not (who.asks.choice or who.asks.refused):
            return {}
        return {g.uuid: (g.index, g.name) for g in self.daemon.inventory().gpus}

    def allocate(self, resource: str, device_ids: list[str]) -> dp.ContainerAllocateResponse:
        with self.lock:
            who = self._identify(resource, len(device_ids), reuse=True)[0]
            if who is not None and (out := admission.refusals(who, u.by_gpu(device_ids), self._named(who))):
                gpu, why = sorted(out.items())[0]
                raise errors.FailedPrecondition(f"container {who.name}: given {resource} on {gpu}, {why}; it runs "
                                                "only on a GPU it may be given")  # fmt: skip
            if resource != u.GPU:
                gpus = u.by_gpu(device_ids)
                if len(gpus) > 1:
                    raise errors.FailedPrecondition(preference.describe(resource, {g: [x.id for x in units]
                                                    for g, units in gpus.items()}, len(device_ids)))  # fmt: skip
                gpu = next(iter(gpus))
                if who is not None and who.held_gpu and who.held_gpu != gpu:
                    raise errors.FailedPrecondition(
                        f"container {who.name}: its {resource} were given on {gpu}, the rest of its slice lies on "
                        f"{who.held_gpu}; a slice lies on one GPU"
                    )
            owner = f"device-plugin {resource}" + (f" {who.name}" if who else "")
            workload = None
            if who is not None:
                namespace, _, pod = who.asks.pod.partition("/")
                workload = pb.Workload(namespace=namespace, pod=pod, container=who.asks.container)
            try:
                response, made = allocation.answer(self.daemon, resource, device_ids, owner, workload)
            except errors.ResourceExhausted:
                # room may be held by allocations the kubelet has let go of (a pod refused or deleted moments ago)
                if not self._reconcile(grace_s=0.0):
                    raise
                response, made = allocation.answer(self.daemon, resource, device_ids, owner, workload)
            for h in made:
                self.steering.allocated(resource, h.gpu)
        self.notify()
        return response

    def notify(self) -> None:
        for fn in self.changed:
            fn()

    def reconcile(self, grace_s: float = GRACE_S) -> int:
        """Release allocations the kubelet no longer holds; how many."""
        with self.lock:
            released = self._reconcile(grace_s)
        if released:
            self.notify()
        return released

    def _reconcile(self, grace_s: float) -> int:
        if self.kubelet is None:
            return 0
        try:
            held = self.kubelet.held()
        except errors.GpusliceError as e:
            log.warning("allocations not reconciled: %s", e)
            return 0
        keys = {h.key for per in held.by_container.values() for resource, ids in per.items()
                for h in _holdings_or_none(resource, ids)}  # fmt: skip
        now_ms = time.time() * 1000
        released = 0
        for s in self.daemon.list():
            if s.owner_kind != pb.DEVICES or s.container_id in keys or now_ms - s.created_unix_ms < grace_s * 1000:
                continue
            if self.daemon.release(s.container_id):
                released += 1
                log.info("released allocation %s (%s): the kubelet holds its units no more", s.container_id,
                         ", ".join(f"{g.share_id} of {g.uuid}" for g in s.gpus))  # fmt: skip
        return released


def _holdings_or_none(resource: str, ids: list[str]) -> list[allocation.Holding]:
    try:
        return allocation.holdings(resource, ids)
    except errors.GpusliceError:
        return []  # a spread the plugin refused: nothing of it was booked

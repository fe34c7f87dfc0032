"""The kubelet's DevicePlugin service (deviceplugin/v1beta1), one instance
per extended resource: the units it lists, and the calls it hands to the
plugin's Booking."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator

from gpuslice import errors
from gpuslice.device_plugin import units as u
from gpuslice.device_plugin.booking import Booking
from gpuslice.grpc_server import status_of
from gpuslice.proto import gpuslice_pb2 as pb
from gpuslice.proto import kubelet_deviceplugin_v1beta1_pb2 as dp
from gpuslice.proto import kubelet_deviceplugin_v1beta1_pb2_grpc as dp_grpc

log = logging.getLogger(__name__)

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"


def _unavailable(resource: str, g: pb.Gpu) -> bool:
    """A unit the kubelet must not count: its GPU is unhealthy, or held whole
    (its memory and cores), or partly sliced (its whole-GPU unit)."""
    if g.health:
        return True
    if resource == u.GPU:
        return g.slices > 0 and not g.exclusive  # held whole, its unit stays: it is the one given
    return g.exclusive


def devices(resource: str, gpus: list[pb.Gpu], numa: Callable[[pb.Gpu], int | None] = lambda g: None
            ) -> list[dp.Device]:  # fmt: skip
    """Every unit of `resource` on these GPUs, with the health the kubelet counts by. A whole
    GPU's unit names the NUMA node its GPU is attached to (`numa`; None: none known), so that
    the kubelet's Topology Manager aligns a container's GPUs with its CPUs and with each other,
    as HAMi's numa-bind asks; the memory and cores units name none: a slice lies on one GPU,
    and a node's alignment policy must not refuse a slice whose GPU the plugin chose."""

    def topology(g: pb.Gpu) -> dp.TopologyInfo | None:
        node = numa(g) if resource == u.GPU else None
        return None if node is None else dp.TopologyInfo(nodes=[dp.NUMANode(ID=node)])

    return [
        dp.Device(ID=unit.id, health=UNHEALTHY if _unavailable(resource, g) else HEALTHY, topology=topology(g))
        for g in gpus
        for unit in u.units(g.uuid, resource, g.memory_total)
    ]


class DevicePluginService(dp_grpc.DevicePluginServicer):
    """`inventory()` returns the daemon's GPUs; notify() when they (or their
    use) may have changed, and ListAndWatch sends the list again."""

    def __init__(self, resource: str, inventory: Callable[[], list[pb.Gpu]], booking: Booking,
                 numa: Callable[[pb.Gpu], int | None] = lambda g: None) -> None:  # fmt: skip
        self.resource = resource
        self.inventory = inventory
        self.numa = numa
        self.booking = booking
        self.changed = threading.Condition()
        self.version = 0
        self.stopped = False
        booking.changed.append(self.notify)

    def notify(self) -> None:
        with self.changed:
            self.version += 1
            self.changed.notify_all()

    def stop(self) -> None:
        with self.changed:
            self.stopped = True
            self.changed.notify_all()

    def GetDevicePluginOptions(self, request, context):
        return dp.DevicePluginOptions(get_preferred_allocation_available=True)

    def ListAndWatch(self, request, context) -> Iterator[dp.ListAndWatchResponse]:
        seen = -1
        sent: list[dp.Device] | None = None
        while context.is_active():
            with self.changed:
                while self.version == seen and not self.stopped and context.is_active():
                    self.changed.wait(1.0)
                if self.stopped:
                    return
                seen = self.version
            try:
                now = devices(self.resource, self.inventory(), self.numa)
            except errors.GpusliceError as e:
                log.warning("%s: the daemon's GPUs: %s; the kubelet keeps the last list", self.resource, e)
                continue
            if now != sent:
                sent = now
                yield dp.ListAndWatchResponse(devices=now)

    def GetPreferredAllocation(self, request, context):
        reply = dp.PreferredAllocationResponse()
        for c in request.container_requests:
            try:
                chosen = self.booking.prefer(
                    self.resource, list(c.available_deviceIDs), list(c.must_include_deviceIDs), c.allocation_size
                )
            except errors.GpusliceError as e:
                # the kubelet fails the pod's admission with this line (UnexpectedAdmissionError)
                log.warning("%s: %s", self.resource, e)
                context.abort(status_of(e), str(e))
            reply.container_responses.append(dp.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return reply

    def Allocate(self, request, context):
        reply = dp.AllocateResponse()
        for c in request.container_requests:
            try:
                reply.container_responses.append(self.booking.allocate(self.resource, list(c.devices_ids)))
            except errors.GpusliceError as e:
                log.warning("%s: Allocate %s: %s", self.resource, list(c.devices_ids)[:4], e)
                context.abort(status_of(e), str(e))
        return reply

    def PreStartContainer(self, request, context):
        return dp.PreStartContainerResponse()

"""The kubelet's DevicePlugin service (deviceplugin/v1beta1), one instance
per extended resource: the units it lists, and where a container's units go.
Allocate comes with the daemon's side (docs/device-plugin.md)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from gpuslice import errors
from gpuslice.device_plugin import preference
from gpuslice.device_plugin import units as u
from gpuslice.device_plugin.preference import Partner
from gpuslice.proto import gpuslice_pb2 as pb
from gpuslice.proto import kubelet_deviceplugin_v1beta1_pb2 as dp
from gpuslice.proto import kubelet_deviceplugin_v1beta1_pb2_grpc as dp_grpc

log = logging.getLogger(__name__)

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
PARTNER_S = 2.0  # a container's resources are allocated back to back; older is another container's


class Steering:
    """What was allocated last, shared by the resources' services: the GPU a
    container's next resource is steered to (preference.py)."""

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


def devices(resource: str, gpus: list[pb.Gpu]) -> list[dp.Device]:
    """Every unit of `resource` on these GPUs; a GPU's units are unhealthy with it."""
    return [
        dp.Device(ID=unit.id, health=UNHEALTHY if g.health else HEALTHY)
        for g in gpus
        for unit in u.units(g.uuid, resource, g.memory_total)
    ]


class DevicePluginService(dp_grpc.DevicePluginServicer):
    """`inventory()` returns the daemon's GPUs; notify() when they (or their
    health) may have changed, and ListAndWatch sends the list again. Allocate
    is the generated base's UNIMPLEMENTED until the daemon's side exists."""

    def __init__(self, resource: str, inventory: Callable[[], list[pb.Gpu]], steering: Steering) -> None:
        self.resource = resource
        self.inventory = inventory
        self.steering = steering
        self.changed = threading.Condition()
        self.version = 0
        self.stopped = False

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
        while context.is_active():
            with self.changed:
                while self.version == seen and not self.stopped and context.is_active():
                    self.changed.wait(1.0)
                if self.stopped:
                    return
                seen = self.version
            yield dp.ListAndWatchResponse(devices=devices(self.resource, self.inventory()))

    def GetPreferredAllocation(self, request, context):
        reply = dp.PreferredAllocationResponse()
        for c in request.container_requests:
            try:
                chosen = preference.prefer(self.resource, list(c.available_deviceIDs), list(c.must_include_deviceIDs),
                                           c.allocation_size, self.steering.partner())  # fmt: skip
            except errors.GpusliceError as e:
                # the kubelet takes any devices it likes when this fails; Allocate then refuses a spread
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
            reply.container_responses.append(dp.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return reply

    def PreStartContainer(self, request, context):
        return dp.PreStartContainerResponse()

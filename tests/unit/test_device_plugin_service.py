"""The device plugin's service as the kubelet calls it, over the official
wire format (its generated stubs), on a unix socket."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest

from gpuslice.device_plugin import units as u
from gpuslice.device_plugin.booking import Booking, Steering
from gpuslice.device_plugin.service import DevicePluginService
from gpuslice.proto import gpuslice_pb2 as pb
from gpuslice.proto import kubelet_deviceplugin_v1beta1_pb2 as dp
from gpuslice.proto import kubelet_deviceplugin_v1beta1_pb2_grpc as dp_grpc

pytestmark = pytest.mark.unit

A, B = "GPU-aaaaaaaa-0000", "GPU-bbbbbbbb-0000"


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def plugin(tmp_path):  # type: ignore[no-untyped-def]
    gpus = [pb.Gpu(index=0, uuid=A, memory_total=4 * u.GIB), pb.Gpu(index=1, uuid=B, memory_total=8 * u.GIB)]
    clock = Clock()
    steering = Steering(clock)
    booking = Booking(None, None, None, steering)  # type: ignore[arg-type]  # no daemon: what is asked here needs none
    services = {r: DevicePluginService(r, lambda: gpus, booking) for r in (u.MEMORY, u.CORES)}
    servers, stubs = [], {}
    for r, service in services.items():
        server = grpc.server(futures.ThreadPoolExecutor(4))
        dp_grpc.add_DevicePluginServicer_to_server(service, server)
        path = tmp_path / f"{r.split('/')[1]}.sock"
        server.add_insecure_port(f"unix:{path}")
        server.start()
        servers.append(server)
        stubs[r] = dp_grpc.DevicePluginStub(grpc.insecure_channel(f"unix:{path}"))
    yield gpus, services, stubs, steering, clock
    for service in services.values():
        service.stop()
    for server in servers:
        server.stop(0)


def test_options_and_the_listed_units_follow_the_gpus_and_their_health(plugin):
    gpus, services, stubs, _, _ = plugin
    assert stubs[u.MEMORY].GetDevicePluginOptions(dp.Empty()).get_preferred_allocation_available
    stream = stubs[u.MEMORY].ListAndWatch(dp.Empty())
    first = next(stream)
    assert len(first.devices) == 12 and {d.health for d in first.devices} == {"Healthy"}
    gpus[1].health = "2 uncorrected ECC errors"
    services[u.MEMORY].notify()
    second = next(stream)
    unhealthy = {d.ID for d in second.devices if d.health == "Unhealthy"}
    assert unhealthy == {x.id for x in u.units(B, u.MEMORY, 8 * u.GIB)}
    stream.cancel()


def ask(stub, available: list[str], size: int, must: list[str] | None = None) -> list[str]:  # type: ignore[no-untyped-def]
    req = dp.PreferredAllocationRequest(container_requests=[dp.ContainerPreferredAllocationRequest(
        available_deviceIDs=available, must_include_deviceIDs=must or [], allocation_size=size)])  # fmt: skip
    return list(stub.GetPreferredAllocation(req).container_responses[0].deviceIDs)


def test_a_containers_second_resource_is_steered_onto_its_firsts_gpu(plugin):
    _, _, stubs, steering, clock = plugin
    cores = [x.id for g in (A, B) for x in u.units(g, u.CORES, 0)]
    assert {u.parse(d).gpu for d in ask(stubs[u.CORES], cores, 30)} == {A}  # binpack: the first fullest
    steering.allocated(u.MEMORY, B)  # the kubelet just allocated this container's memory on B
    assert {u.parse(d).gpu for d in ask(stubs[u.CORES], cores, 30)} == {B}
    clock.now += 5  # another container's, long ago: no steering
    assert {u.parse(d).gpu for d in ask(stubs[u.CORES], cores, 30)} == {A}


def test_a_size_no_gpu_has_is_refused_with_each_gpus_free_units(plugin):
    _, _, stubs, _, _ = plugin
    memory = [x.id for g, n in ((A, 4), (B, 8)) for x in u.units(g, u.MEMORY, n * u.GIB)]
    with pytest.raises(grpc.RpcError) as e:
        ask(stubs[u.MEMORY], memory, 10)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert e.value.details() == f"10 gpuslice.io/memory must lie on one GPU; free: {A} has 4, {B} has 8"

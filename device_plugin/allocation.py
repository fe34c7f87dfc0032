"""Allocate's answer: the units the kubelet took, booked in the daemon, and
what the container gets for them.

Each allocation is a slice of kind `devices` in the daemon, keyed by a digest
of the resource and its device IDs: the kubelet never gives a unit to two
containers at once, so the key names one container's holding, and the same
key comes back when the kubelet reuses the holding for a restarted container
(it answers from its checkpoint without calling Allocate). A whole GPU
(`gpuslice.io/gpu`) is one allocation per GPU.

The answer carries, per allocation, an env entry naming its share with the
daemon's membership key (the container joins exactly what it was given, as
with a DRA claim's share, allocator/membership.py), and the GPU's CDI device
from the node spec: on the memory or whole-GPU answer only, so that a
container asking memory and cores gets the device once."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

from gpuslice import constants, errors
from gpuslice.client import AllocatorClient
from gpuslice.device_plugin import units as u
from gpuslice.proto import gpuslice_pb2 as pb
from gpuslice.proto import kubelet_deviceplugin_v1beta1_pb2 as dp

log = logging.getLogger(__name__)

SHARE = {u.MEMORY: "memory", u.CORES: "cores", u.GPU: "gpu"}


@dataclass(frozen=True)
class Holding:
    """Units of one resource on one GPU that make one allocation."""

    key: str
    resource: str
    gpu: str
    device_ids: tuple[str, ...]


def allocation_key(resource: str, device_ids: list[str] | tuple[str, ...]) -> str:
    digest = hashlib.sha256("\n".join([resource, *sorted(device_ids)]).encode()).hexdigest()[:24]
    return constants.devices_slice_key(digest)


def holdings(resource: str, device_ids: list[str]) -> list[Holding]:
    """The allocations that these units make (one GPU per allocation)."""
    grouped = u.by_gpu(device_ids)
    if resource == u.GPU:
        return [
            Holding(allocation_key(resource, [x.id]), resource, x.gpu, (x.id,))
            for x in (unit for found in grouped.values() for unit in found)
        ]
    if len(grouped) != 1:
        raise errors.FailedPrecondition(f"{len(device_ids)} {resource} span GPUs {', '.join(sorted(grouped))}")
    gpu = next(iter(grouped))
    return [Holding(allocation_key(resource, device_ids), resource, gpu, tuple(sorted(device_ids)))]


def env_entry(key: str, resource: str, token: str) -> tuple[str, str]:
    share = SHARE[resource]
    return f"{constants.ENV_SHARE_PREFIX}{key.replace('-', '')}", f"{key}/{share}/{token}"


def cdi_device(gpu: str) -> str:
    return f"{constants.CDI_KIND}={gpu}"


def reserve(daemon: AllocatorClient, h: Holding, owner: str, workload: pb.Workload | None = None) -> str:
    """Book the holding (for `workload`, the pod's container, where known); its share's membership key."""
    size = len(h.device_ids)
    memory = size * u.GIB if h.resource == u.MEMORY else 0
    cores = size if h.resource == u.CORES else 0
    reply = daemon.reserve_devices(
        h.key, SHARE[h.resource], h.gpu, memory=memory, cores=cores, owner=owner, workload=workload
    )
    return reply.share_keys[SHARE[h.resource]]


def answer(
    daemon: AllocatorClient, resource: str, device_ids: list[str], owner: str, workload: pb.Workload | None = None
) -> tuple[dp.ContainerAllocateResponse, list[Holding]]:
    """Book every allocation the units make, all or none: the container's answer, and what was booked."""
    made: list[Holding] = []
    response = dp.ContainerAllocateResponse()
    try:
        for h in holdings(resource, device_ids):
            token = reserve(daemon, h, owner, workload)
            made.append(h)
            name, value = env_entry(h.key, resource, token)
            response.envs[name] = value
            if resource != u.CORES:
                response.cdi_devices.append(dp.CDIDevice(name=cdi_device(h.gpu)))
    except BaseException:
        for h in made:
            try:
                daemon.release(h.key)
            except errors.GpusliceError as e:  # said, and the reconcile loop releases it later
                log.warning("allocation %s left booked after a failed Allocate: %s", h.key, e)
        raise
    return response, made

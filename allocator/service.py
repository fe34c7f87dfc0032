"""The gpuslice.v1 Allocator service: gRPC in front of the SliceManager, with
proper status codes and one-line details."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import grpc

from gpuslice import errors, inventory, request
from gpuslice.allocator import metrics
from gpuslice.allocator.compute import ComputeController
from gpuslice.allocator.placement import ShareRequest
from gpuslice.allocator.records import Workload
from gpuslice.allocator.slices import SliceManager, SliceView
from gpuslice.grpc_server import status_of
from gpuslice.proto import gpuslice_pb2 as pb
from gpuslice.proto import gpuslice_pb2_grpc as pb_grpc
from gpuslice.request import ComputePolicy, Priority

log = logging.getLogger(__name__)


def slice_message(view: SliceView, compute: ComputeController | None = None, member_of: str = "") -> pb.Slice:
    r = view.record
    gpus = []
    in_files = {u: i for i, u in enumerate(r.file_gpus)}
    extra = view.driver_side
    for a in r.allocations:
        target, used = compute.view(r.id, in_files[a.gpu_uuid]) if compute else (0.0, 0.0)
        fitting = compute.fitting(r.id, in_files[a.gpu_uuid]) if compute else False
        gpus.append(
            pb.SliceGpu(index=a.gpu_index, uuid=a.gpu_uuid, memory_limit=a.memory, cores=a.cores,
                        compute_target=target, compute_used=used, share_id=a.share, compute_fitting=fitting,
                        driver_side=extra[in_files[a.gpu_uuid]] if extra else 0,
                        policy=a.policy or r.policy, priority=a.priority or r.priority,
                        owner_kind=a.of.kind.name if a.of else None, owner_uid=a.of.uid if a.of else "")
        )  # fmt: skip
    return pb.Slice(
        id=r.id,
        container_id=r.container_id,
        state=r.state,
        gpus=gpus,
        policy=r.policy,
        priority=r.priority,
        whole=r.whole,
        created_unix_ms=r.created_ms,
        pid=r.pid or 0,
        pid_ns=r.pid_ns or 0,
        cgroup=r.cgroup or "",
        memory_used=view.memory_used,
        processes=view.processes,
        enforcement=view.enforcement,
        kind=r.kind.value,
        owner_kind=r.kind.name,  # the enum value of that name (tests/unit/test_owner_kinds.py)
        owner_uid=r.share_owner.uid,
        member_of=member_of,
        workload=pb.Workload(namespace=r.workload.namespace, pod=r.workload.pod, container=r.workload.container),
    )


def workload(w: pb.Workload) -> Workload:
    """The workload from the wire: names of at most 253 characters (a DNS subdomain's)."""
    names = (w.namespace, w.pod, w.container)
    if any(len(n) > 253 for n in names):
        raise errors.InvalidArgument("workload: a namespace, pod or container name over 253 characters")
    return Workload(*names)


def share_request(share: pb.Share) -> ShareRequest:
    """A claim's share from the wire: its values checked, one line for a bad one."""
    try:
        policy = ComputePolicy(share.policy or ComputePolicy.ELASTIC.value)
        priority = Priority(share.priority or Priority.NORMAL.value)
    except ValueError:
        raise errors.InvalidArgument(
            f"share of GPU {share.gpu_index}: policy {share.policy!r} / priority {share.priority!r}; accepted "
            "policy hard or elastic, priority high, normal or low"
        ) from None
    if share.cores > 100:
        raise errors.InvalidArgument(f"share of GPU {share.gpu_index}: cores {share.cores}; accepted 0 to 100")
    return ShareRequest(share.gpu_index, share.memory or None, share.cores or None, policy, priority, share.share_id)


def devices_share(req: pb.ReserveDevicesRequest, inv: inventory.Inventory) -> ShareRequest:
    """A device plugin allocation from the wire, as the share it books."""
    gpu = next((g for g in inv.gpus if g.uuid == req.gpu_uuid), None)
    if gpu is None:
        have = ", ".join(g.uuid for g in inv.gpus)
        raise errors.InvalidArgument(f"allocation {req.key}: no GPU {req.gpu_uuid!r} on this node; it has {have}")
    if req.resource == "memory" and req.memory > 0 and not req.cores:
        return ShareRequest(gpu.index, memory=req.memory, share="memory")
    if req.resource == "cores" and 1 <= req.cores <= 100 and not req.memory:
        return ShareRequest(gpu.index, memory=0, cores=req.cores, share="cores")
    if req.resource == "gpu" and not req.memory and not req.cores:
        return ShareRequest(gpu.index, share="gpu")
    raise errors.InvalidArgument(
        f"allocation {req.key}: resource {req.resource!r} with memory {req.memory} and cores {req.cores}; accepted "
        "memory (bytes > 0, no cores), cores (1 to 100, no memory) or gpu (neither)"
    )


def _rpc(name: str) -> Callable:
    """Time the call, count it by status, and turn our errors into gRPC statuses."""

    def wrap(fn: Callable) -> Callable:
        def handler(self: AllocatorService, request, context: grpc.ServicerContext):
            start = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                return fn(self, request, context)
            except errors.GpusliceError as e:
                code = status_of(e)
                context.abort(code, str(e))
            except Exception as e:
                code = grpc.StatusCode.INTERNAL
                log.exception("%s failed", name)
                context.abort(code, f"{name}: internal error: {e}")
            finally:
                metrics.RPC_SECONDS.labels(name).observe(time.perf_counter() - start)
                metrics.RPCS.labels(name, code.name).inc()

        return handler

    return wrap


class AllocatorService(pb_grpc.AllocatorServicer):
    def __init__(self, manager: SliceManager, compute: ComputeController | None = None) -> None:
        self.m = manager
        self.compute = compute

    @_rpc("Inventory")
    def Inventory(self, request, context):
        inv = self.m.inventory
        caps = {c.uuid: c for c in self.m.capacities()}
        limits = self.m.driver.limits.state if self.m.driver.limits else {}
        gpus = [
            pb.Gpu(
                index=g.index, uuid=g.uuid, name=g.name, pci_bus_id=g.pci_bus_id, memory_total=g.memory_total,
                memory_reserved=caps[g.uuid].memory_reserved, cores_reserved=caps[g.uuid].cores_reserved,
                slices=caps[g.uuid].slices, exclusive=caps[g.uuid].exclusive,
                compute_capability=g.compute_capability, health=inventory.health(g.uuid),
                driver_limits=limits.get(g.uuid, ""),
            )
            for g in inv.gpus
        ]  # fmt: skip
        links = [
            pb.Link(a=a, b=b, pcie=level, nvlinks=1 if inv.nvlink.get((a, b)) else 0)
            for (a, b), level in sorted(inv.topology.items())
            if a < b
        ]
        return pb.InventoryReply(gpus=gpus, links=links, driver_version=inv.driver_version)

    def _message(self, view: SliceView, compute: ComputeController | None = None) -> pb.Slice:
        member_of = self.m.index.target(view.record).container_id if view.record.member_of else ""
        return slice_message(view, compute, member_of)

    @_rpc("Reserve")
    def Reserve(self, req, context):
        asked = request.read(request.Asked(dict(req.annotations), {}))
        if asked is None:
            raise errors.InvalidArgument(f"no {request.PREFIX}* annotation: the container asks for no GPU")
        # the record the change returned: no second read of the store
        return self._message(self.m.view(self.m.reserve(req.container_id, asked, req.owner, workload(req.workload))))

    @_rpc("ReserveClaim")
    def ReserveClaim(self, req, context):
        shares = [share_request(s) for s in req.shares]
        rec = self.m.reserve_claim(req.uid, shares, req.owner, workload(req.workload))
        message = self._message(self.m.view(rec))
        message.share_keys.update(self.m.share_keys(rec))
        return message

    @_rpc("ReserveDevices")
    def ReserveDevices(self, req, context):
        rec = self.m.reserve_devices(req.key, devices_share(req, self.m.inventory), req.owner, workload(req.workload))
        message = self._message(self.m.view(rec))
        message.share_keys.update(self.m.share_keys(rec))
        return message

    @_rpc("Bind")
    def Bind(self, request, context):
        return self._message(self.m.view(self.m.bind(request.container_id, request.pid)))

    @_rpc("Release")
    def Release(self, request, context):
        return pb.ReleaseReply(released=self.m.release(request.container_id))

    @_rpc("Get")
    def Get(self, request, context):
        return self._message(self.m.get(request.container_id), self.compute)

    @_rpc("List")
    def List(self, request, context):
        return pb.ListReply(slices=[self._message(v, self.compute) for v in self.m.views()])

    @_rpc("Resize")
    def Resize(self, request, context):
        return self._message(self.m.view(self.m.resize(request.container_id, dict(request.annotations))))

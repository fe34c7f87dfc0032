"""The gRPC services the kubelet calls: DRAPlugin in versions v1 and v1beta1
(kubelets 1.32-1.33 speak v1beta1; the two differ only in v1's share_id), and
the plugin-registration service on the kubelet's registry socket."""

from __future__ import annotations

import logging
from typing import Any

import grpc

from gpuslice import errors
from gpuslice.dra.prepare import ClaimRef, Preparer
from gpuslice.dra.resource_slice import DRIVER
from gpuslice.proto import kubelet_dra_v1_pb2 as v1
from gpuslice.proto import kubelet_dra_v1_pb2_grpc as v1_grpc
from gpuslice.proto import kubelet_dra_v1beta1_pb2 as v1beta1
from gpuslice.proto import kubelet_dra_v1beta1_pb2_grpc as v1beta1_grpc
from gpuslice.proto import kubelet_pluginregistration_pb2 as reg
from gpuslice.proto import kubelet_pluginregistration_pb2_grpc as reg_grpc

log = logging.getLogger(__name__)

# what the kubelet reads from supported_versions: "<gRPC package's last part>.<service>"
SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


def _error(e: BaseException) -> str:
    if isinstance(e, errors.GpusliceError):
        return str(e)
    log.exception("claim failed")
    return f"internal error: {type(e).__name__}: {e}"


class _DRAPlugin:
    """One implementation for both versions; `pb` is the version's messages."""

    def __init__(self, preparer: Preparer, pb: Any, share_ids: bool) -> None:
        self.preparer = preparer
        self.pb = pb
        self.share_ids = share_ids

    def NodePrepareResources(self, request, context):
        reply = self.pb.NodePrepareResourcesResponse()
        for c in request.claims:
            try:
                devices = self.preparer.prepare(ClaimRef(c.uid, c.namespace, c.name))
                for d in devices:
                    if not self.share_ids:
                        d = {k: v for k, v in d.items() if k != "share_id"}
                    reply.claims[c.uid].devices.append(self.pb.Device(**d))
            except Exception as e:  # one claim's failure is its own answer, never the call's
                reply.claims[c.uid].error = _error(e)
        return reply

    def NodeUnprepareResources(self, request, context):
        reply = self.pb.NodeUnprepareResourcesResponse()
        for c in request.claims:
            try:
                self.preparer.unprepare(ClaimRef(c.uid, c.namespace, c.name))
                reply.claims[c.uid].error = ""
            except Exception as e:
                reply.claims[c.uid].error = _error(e)
        return reply


class V1(_DRAPlugin, v1_grpc.DRAPluginServicer):
    def __init__(self, preparer: Preparer) -> None:
        super().__init__(preparer, v1, share_ids=True)


class V1beta1(_DRAPlugin, v1beta1_grpc.DRAPluginServicer):
    def __init__(self, preparer: Preparer) -> None:
        super().__init__(preparer, v1beta1, share_ids=False)


def add_dra(server: grpc.Server, preparer: Preparer) -> None:
    v1_grpc.add_DRAPluginServicer_to_server(V1(preparer), server)
    v1beta1_grpc.add_DRAPluginServicer_to_server(V1beta1(preparer), server)


class Registration(reg_grpc.RegistrationServicer):
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.registered: bool | None = None  # what the kubelet said last
        self.error = ""

    def GetInfo(self, request, context):
        return reg.PluginInfo(type="DRAPlugin", name=DRIVER, endpoint=self.endpoint, supported_versions=SERVICES)

    def NotifyRegistrationStatus(self, request, context):
        self.registered, self.error = request.plugin_registered, request.error
        if request.plugin_registered:
            log.info("registered with the kubelet as DRA driver %s", DRIVER)
        else:
            log.error("the kubelet refused the registration: %s", request.error)
        return reg.RegistrationStatusResponse()


def add_registration(server: grpc.Server, endpoint: str) -> Registration:
    servicer = Registration(endpoint)
    reg_grpc.add_RegistrationServicer_to_server(servicer, server)
    return servicer

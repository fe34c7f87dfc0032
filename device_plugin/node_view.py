"""What the plugin reads about its node: the kubelet's holdings (the
pod-resources service, podresources/v1) and the node's pending pods (the API
server), as admission.py takes them."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc

from gpuslice import errors, kube
from gpuslice.device_plugin import units as u
from gpuslice.device_plugin.admission import Asks, Held, PendingPod
from gpuslice.proto import kubelet_podresources_v1_pb2 as pr
from gpuslice.proto import kubelet_podresources_v1_pb2_grpc as pr_grpc

log = logging.getLogger(__name__)

T = TypeVar("T")
POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
_WHOLE = re.compile(r"^[0-9]+\Z")


class PodResources:
    """A client of the kubelet's pod-resources service."""

    def __init__(self, socket: Path = POD_RESOURCES_SOCKET, timeout: float = 5.0) -> None:
        self.socket = socket
        self.timeout = timeout
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.stub = pr_grpc.PodResourcesListerStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def _call(self, method: Callable[..., T], request: object) -> T:
        try:
            return method(request, timeout=self.timeout)
        except grpc.RpcError as e:
            raise errors.Unavailable(f"the kubelet's pod-resources service at {self.socket}: {e.details()}") from e

    def _allocatable(self) -> pr.AllocatableResourcesResponse:
        return self._call(self.stub.GetAllocatableResources, pr.AllocatableResourcesRequest())

    def held(self) -> Held:
        listed = self._call(self.stub.List, pr.ListPodResourcesRequest())
        allocatable = self._allocatable()
        held = Held()
        for pod in listed.pod_resources:
            name = f"{pod.namespace}/{pod.name}"
            held.pods.add(name)
            for c in pod.containers:
                ours = {d.resource_name: list(d.device_ids) for d in c.devices if d.resource_name in u.RESOURCES}
                if ours:
                    held.by_container[(name, c.name)] = ours
        for d in allocatable.devices:
            if d.resource_name in u.RESOURCES:
                held.allocatable.setdefault(d.resource_name, []).extend(d.device_ids)
        return held

    def allocatable_names(self) -> set[str]:
        """Every extended resource the kubelet can allocate on this node."""
        return {d.resource_name for d in self._allocatable().devices}


def _units(value: Any) -> int | None:
    text = str(value)
    return int(text) if _WHOLE.match(text) else None  # extended resources are whole numbers


def asks_of(pod: dict[str, Any]) -> PendingPod | None:
    """A pending pod's containers that ask our resources, in the kubelet's order; None if none does."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    name = f"{meta.get('namespace')}/{meta.get('name')}"
    found = []
    for c in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        limits = ((c.get("resources") or {}).get("limits")) or {}
        ours = {r: n for r in u.RESOURCES if r in limits and (n := _units(limits[r])) is not None}
        found.append(Asks(name, c.get("name", ""), ours))
    if not any(a.limits for a in found):
        return None
    return PendingPod(name, tuple(a for a in found if a.limits))


class Pods:
    """The node's pods from the API server (one list per call: admission is rare)."""

    def __init__(self, node: str, kubeconfig: str | None = None, timeout: float = 5.0) -> None:
        client = kube.client(kubeconfig, "the device plugin")
        self.node = node
        self.core = client.CoreV1Api()
        self.api_exception = client.ApiException
        self.timeout = timeout

    def pending(self) -> list[PendingPod]:
        try:
            raw = self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self.node},status.phase=Pending",
                _preload_content=False, _request_timeout=self.timeout,
            )  # fmt: skip
        except self.api_exception as e:
            raise errors.Unavailable(f"pods of node {self.node}: the API server answered {e.status} {e.reason}") from e
        except OSError as e:
            raise errors.Unavailable(f"pods of node {self.node}: the API server: {e}") from e
        pods = json.loads(raw.data).get("items") or []  # _preload_content=False: the raw response
        found = []
        for pod in pods:
            if (pod.get("metadata") or {}).get("deletionTimestamp"):
                continue
            asks = asks_of(pod)
            if asks is not None:
                found.append(asks)
        return found

"""What the plugin reads about its node: the kubelet's holdings (the
pod-resources service, podresources/v1) and the node's pending pods (the API
server), as admission.py takes them."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import grpc

from gpuslice import errors, kube
from gpuslice.device_plugin import units as u
from gpuslice.device_plugin.admission import Held, PendingPod, asks_of
from gpuslice.device_plugin.options import POD_RESOURCES_SOCKET
from gpuslice.proto import kubelet_podresources_v1_pb2 as pr
from gpuslice.proto import kubelet_podresources_v1_pb2_grpc as pr_grpc

log = logging.getLogger(__name__)

T = TypeVar("T")


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


class NodeApi:
    """This node in the API server: its pending pods (one list per call:
    admission is rare), and the per-GPU state the plugin publishes on it."""

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
                _preload_content=False,
                _request_timeout=self.timeout,
            )
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

    def annotate(self, key: str, value: str) -> None:
        """Set one annotation on this node (a merge patch: nothing else of the node is touched)."""
        body = {"metadata": {"annotations": {key: value}}}
        try:
            self.core.patch_node(self.node, body, _content_type="application/merge-patch+json",
                                 _preload_content=False, _request_timeout=self.timeout)  # fmt: skip
        except self.api_exception as e:
            raise errors.Unavailable(f"node {self.node}: the API server answered {e.status} {e.reason}") from e
        except OSError as e:
            raise errors.Unavailable(f"node {self.node}: the API server: {e}") from e

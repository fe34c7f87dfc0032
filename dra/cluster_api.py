"""The API server, through the `kubernetes` client: the claims the kubelet
names (read), and the node's ResourceSlice (created, then replaced)."""

from __future__ import annotations

import logging
from typing import Any, cast

from gpuslice import errors, kube

log = logging.getLogger(__name__)

GROUP, VERSION = "resource.k8s.io", "v1"


class ClusterApi:
    def __init__(self, kubeconfig: str | None = None, timeout: float = 10.0) -> None:
        client = kube.client(kubeconfig, "the kubelet plugin")
        self.client = client
        self.objects = client.CustomObjectsApi()
        self.timeout = timeout

    def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            claim = self.objects.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "resourceclaims", name, _request_timeout=self.timeout
            )
        except self.client.ApiException as e:
            raise errors.NotFound(f"claim {namespace}/{name}: the API server answered {e.status} {e.reason}") from e
        return cast(dict[str, Any], claim)

    def publish_slice(self, body: dict[str, Any]) -> None:
        """Create the ResourceSlice, or replace the one there (its resourceVersion kept)."""
        name = body["metadata"]["name"]
        try:
            current = cast(dict[str, Any], self.objects.get_cluster_custom_object(
                GROUP, VERSION, "resourceslices", name, _request_timeout=self.timeout))  # fmt: skip
        except self.client.ApiException as e:
            if e.status != 404:
                raise errors.Unavailable(f"ResourceSlice {name}: {e.status} {e.reason}") from e
            self.objects.create_cluster_custom_object(
                GROUP, VERSION, "resourceslices", body, _request_timeout=self.timeout
            )
            return
        version = current["metadata"]["resourceVersion"]
        body = {**body, "metadata": {**body["metadata"], "resourceVersion": version}}
        self.objects.replace_cluster_custom_object(
            GROUP, VERSION, "resourceslices", name, body, _request_timeout=self.timeout
        )

"""The cluster's largest GPU, for refusing a vGPU larger than any GPU when
the pod is created rather than leaving it unschedulable: what the device
plugins publish on their Nodes (`gpuslice.io/gpus`, each GPU's size in GiB
units, device_plugin/node_gpus.py), read every `period` seconds, or the
configured size (`--largest-gpu-memory`) where that is given. Nothing
known (runtimeClass mode publishes nothing, or no node has published yet,
or the API server cannot be read): nothing is refused for its size here,
and placement refuses it instead."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from gpuslice import errors
from gpuslice.device_plugin import node_gpus
from gpuslice.device_plugin import units as u

log = logging.getLogger(__name__)

MiB = 1 << 20
PERIOD_S = 60.0


def largest_published(nodes: list[dict[str, Any]]) -> int:
    """The largest GPU's memory in MiB among the nodes' published state; 0 if none is."""
    largest = 0
    for node in nodes:
        text = ((node.get("metadata") or {}).get("annotations") or {}).get(node_gpus.ANNOTATION)
        if not text:
            continue
        try:
            published = node_gpus.decode(text)
        except errors.InvalidArgument as e:
            log.warning("node %s: %s", (node.get("metadata") or {}).get("name"), e)
            continue
        for gpu in published.gpus.values():
            largest = max(largest, gpu.memory_units * u.GIB // MiB)
    return largest


class LargestGpu:
    """What `mib()` answers: the configured size, else the largest published one, kept fresh by a thread."""

    def __init__(self, configured_mib: int, list_nodes: Callable[[], list[dict[str, Any]]] | None,
                 period_s: float = PERIOD_S) -> None:  # fmt: skip
        self.configured = configured_mib
        self.list_nodes = list_nodes
        self.period_s = period_s
        self.published = 0
        self.stopping = threading.Event()

    def mib(self) -> int:
        return self.configured or self.published

    def refresh(self) -> None:
        assert self.list_nodes is not None
        try:
            found = largest_published(self.list_nodes())
        except errors.GpusliceError as e:
            log.warning("the largest GPU is not known afresh (kept at %d MiB): %s", self.published, e)
            return
        if found != self.published:
            log.info("the largest GPU the device plugins publish: %d MiB", found)
        self.published = found

    def start(self) -> LargestGpu:
        """Read once now (the first review already knows), then every period in a thread."""
        if self.configured or self.list_nodes is None:
            return self  # configured, or nothing to read: no thread
        self.refresh()

        def run() -> None:
            while not self.stopping.wait(self.period_s):
                self.refresh()

        threading.Thread(target=run, name="largest-gpu", daemon=True).start()
        return self

    def stop(self) -> None:
        self.stopping.set()


def node_lister(kubeconfig: str | None, timeout: float = 10.0) -> Callable[[], list[dict[str, Any]]]:
    """Every Node, as raw JSON (one list call: the webhook's only API read)."""
    from gpuslice import kube

    client = kube.client(kubeconfig, "the admission webhook")
    core = client.CoreV1Api()

    def list_nodes() -> list[dict[str, Any]]:
        try:
            raw = core.list_node(_preload_content=False, _request_timeout=timeout)
        except client.ApiException as e:
            raise errors.Unavailable(f"nodes: the API server answered {e.status} {e.reason}") from e
        except Exception as e:  # urllib3's errors (a refused connection, retries spent) are not OSErrors
            raise errors.Unavailable(f"nodes: the API server: {type(e).__name__}: {e}") from e
        return list(json.loads(raw.data).get("items") or [])

    return list_nodes

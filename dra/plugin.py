"""`gpuslice kubelet-plugin`: the DRA services on the plugin's socket, the
registration service in the kubelet's registry, and the node's ResourceSlice
published at start and again whenever the daemon's inventory changes."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc

from gpuslice import errors
from gpuslice.cdi import spec as cdi_spec
from gpuslice.cdi.registry import Registry
from gpuslice.client import AllocatorClient
from gpuslice.dra import resource_slice, service
from gpuslice.dra.checkpoint import Checkpoint
from gpuslice.dra.cluster_api import ClusterApi
from gpuslice.dra.options import Options
from gpuslice.dra.prepare import Preparer
from gpuslice.grpc_server import listen_root_only

log = logging.getLogger(__name__)


def base_spec_source(path: Path | None, registry: Registry | None = None) -> Callable[[], cdi_spec.Spec]:
    """The node's gpuslice.io/gpu spec as it is at each call (`path`, else CDI's). The
    node agent makes it anew when the driver changes, so each prepare reads it again
    (parsed once per version of the file)."""
    reg = registry or Registry()
    return lambda: reg.node(path)[0]


class Plugin:
    def __init__(self, opts: Options, api: ClusterApi | None = None) -> None:
        self.opts = opts
        self.api = api or ClusterApi(opts.kubeconfig)
        self.daemon = AllocatorClient(opts.daemon_socket, timeout=10)
        node_spec = base_spec_source(opts.base_spec)
        node_spec()  # none, or not valid: the plugin does not start, in one line
        self.preparer = Preparer(opts.node, self.daemon, self.api.read_claim, node_spec,
                                 opts.cdi_dir, Checkpoint(opts.plugin_dir / "checkpoint.json"))  # fmt: skip
        self.endpoint = opts.plugin_dir / "dra.sock"
        self.registry_socket = opts.registry_dir / f"{resource_slice.DRIVER}-reg.sock"
        self.stopping = threading.Event()
        self.generation = 0
        self.published: bytes = b""

    def publish(self) -> None:
        """The ResourceSlice, when the GPUs differ from what was published (not
        their use: kube-scheduler keeps the books of consumed capacity)."""
        inventory = self.daemon.inventory()
        for g in inventory.gpus:
            for use in ("memory_reserved", "cores_reserved", "slices", "exclusive"):
                g.ClearField(use)
        seen = inventory.SerializeToString(deterministic=True)
        if seen == self.published:
            return
        self.generation += 1
        for g in inventory.gpus:  # said before it is published: a reader of the slice finds the reason logged
            if g.health:
                log.warning("GPU %d (%s) tainted %s: %s", g.index, g.uuid, resource_slice.UNHEALTHY, g.health)
        self.api.publish_slice(resource_slice.build(self.opts.node, inventory, self.generation, self.opts.sysfs))
        self.published = seen
        log.info(
            "published ResourceSlice %s, generation %d", resource_slice.slice_name(self.opts.node), self.generation
        )

    def serve(self) -> None:
        dra = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        service.add_dra(dra, self.preparer)
        listen_root_only(dra, self.endpoint, own_dir=True)
        registration = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
        service.add_registration(registration, str(self.endpoint))
        listen_root_only(registration, self.registry_socket, own_dir=False)
        dra.start()
        registration.start()  # after the DRA service: the kubelet calls it as soon as it registers us
        log.info("serving %s on %s; registration on %s", resource_slice.DRIVER, self.endpoint, self.registry_socket)
        try:
            while not self.stopping.is_set():
                try:
                    self.publish()
                except grpc.RpcError as e:
                    log.warning("ResourceSlice not published: the daemon: %s", e.details())
                except (errors.GpusliceError, OSError) as e:
                    log.warning("ResourceSlice not published: %s", e)
                self.stopping.wait(self.opts.republish_s)
        finally:
            registration.stop(0)
            dra.stop(5)
            for s in (self.registry_socket, self.endpoint):
                if s.is_socket():
                    os.unlink(s)

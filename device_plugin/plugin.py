"""`gpuslice device-plugin`: one DevicePlugin server per resource in the
kubelet's device-plugins directory, registered on its kubelet.sock, and
registered again, on fresh sockets, whenever the kubelet restarts.

The kubelet deletes every socket in that directory when it starts and makes a
new kubelet.sock (devicemanager `Start` -> `removeContents`); the plugin
notices by kubelet.sock's inode and change time, or its own sockets gone, and
serves and registers anew, as the device plugin guide asks. Between those
checks it reconciles: allocations the kubelet no longer holds (a deleted
pod's) are released within `reconcile_s`."""

from __future__ import annotations

import logging
import os
import threading
from concurrent import futures
from pathlib import Path

import grpc

from gpuslice import errors, pci
from gpuslice.client import AllocatorClient
from gpuslice.device_plugin import node_gpus
from gpuslice.device_plugin import units as u
from gpuslice.device_plugin.booking import Booking
from gpuslice.device_plugin.node_view import NodeApi, PodResources
from gpuslice.device_plugin.options import Options
from gpuslice.device_plugin.service import DevicePluginService
from gpuslice.grpc_server import listen_root_only
from gpuslice.proto import gpuslice_pb2 as pb
from gpuslice.proto import kubelet_deviceplugin_v1beta1_pb2 as dp
from gpuslice.proto import kubelet_deviceplugin_v1beta1_pb2_grpc as dp_grpc

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
VERSION = "v1beta1"


def endpoint_name(resource: str) -> str:
    return f"gpuslice-{resource.removeprefix(u.PREFIX)}.sock"


class Plugin:
    def __init__(self, opts: Options, api: NodeApi | None = None) -> None:
        self.opts = opts
        self.daemon = AllocatorClient(opts.daemon_socket, timeout=10)
        if api is None and opts.use_api:
            api = NodeApi(opts.node, opts.kubeconfig)
        self.api = api
        self.booking = Booking(self.daemon, PodResources(opts.pod_resources), api)
        self.published = ""  # the node's per-GPU state as last published
        self.stopping = threading.Event()
        self.servers: list[tuple[grpc.Server, DevicePluginService, Path]] = []
        self._numa: dict[str, int | None] = {}  # by PCI bus ID: where a device is attached does not change

    def gpus(self) -> list[pb.Gpu]:
        """The daemon's GPUs and their use, read when a ListAndWatch stream asks
        (it sends the list only when the units' health changed)."""
        return list(self.daemon.inventory().gpus)

    def numa_node(self, g: pb.Gpu) -> int | None:
        """The NUMA node the GPU is attached to, read from sysfs once."""
        if g.pci_bus_id not in self._numa:
            self._numa[g.pci_bus_id] = pci.numa_node(g.pci_bus_id, self.opts.sysfs)
        return self._numa[g.pci_bus_id]

    @property
    def kubelet_socket(self) -> Path:
        return self.opts.plugin_dir / KUBELET_SOCKET

    def _kubelet_identity(self) -> tuple[int, int] | None:
        """kubelet.sock's inode and change time (an inode number alone comes back for a new file)."""
        try:
            st = os.stat(self.kubelet_socket)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_ctime_ns

    def _ours_removed(self) -> bool:
        return any(not path.is_socket() for _, _, path in self.servers)

    def start_servers(self) -> None:
        self.booking.changed.clear()
        for resource in u.RESOURCES:
            service = DevicePluginService(resource, self.gpus, self.booking, self.numa_node)
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
            dp_grpc.add_DevicePluginServicer_to_server(service, server)
            path = self.opts.plugin_dir / endpoint_name(resource)
            listen_root_only(server, path, own_dir=False)  # only root (the kubelet) may call Allocate
            server.start()
            self.servers.append((server, service, path))

    def stop_servers(self) -> None:
        for server, service, path in self.servers:
            service.stop()
            server.stop(1)
            if path.is_socket():
                path.unlink()
        self.servers.clear()

    def register(self) -> None:
        with grpc.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
            stub = dp_grpc.RegistrationStub(channel)
            for resource in u.RESOURCES:
                stub.Register(dp.RegisterRequest(
                    version=VERSION, endpoint=endpoint_name(resource), resource_name=resource,
                    options=dp.DevicePluginOptions(get_preferred_allocation_available=True),
                ), timeout=10)  # fmt: skip
        log.info("registered %s with the kubelet at %s", ", ".join(u.RESOURCES), self.kubelet_socket)

    def publish(self) -> None:
        """Each GPU's free units on this node's Node, for the scheduler
        extender (node_gpus.py); written only when it changed."""
        if self.api is None or self.booking.kubelet is None:
            return
        state = node_gpus.of_node(self.gpus(), self.booking.kubelet.held()).encode()
        if state != self.published:
            self.api.annotate(node_gpus.ANNOTATION, state)
            self.published = state
            log.info("published %s: %s", node_gpus.ANNOTATION, state)

    def serve(self) -> None:
        registered: tuple[int, int] | None = None
        try:
            while not self.stopping.is_set():
                inode = self._kubelet_identity()
                if inode is not None and (inode != registered or self._ours_removed()):
                    # a (new) kubelet: it removed our sockets at its start; serve on new ones, then register
                    self.stop_servers()
                    self.start_servers()
                    try:
                        self.register()
                        registered = inode
                    except grpc.RpcError as e:
                        log.warning("the kubelet refused registration: %s; trying again", e.details())
                elif inode is None and registered is not None:
                    log.info("the kubelet's %s is gone; waiting for it", self.kubelet_socket)
                    registered = None
                try:
                    self.booking.reconcile()
                    for _, service, _ in self.servers:
                        service.notify()  # ListAndWatch sends the units again if the daemon's GPUs changed
                    if registered is not None:
                        self.publish()
                except (errors.GpusliceError, grpc.RpcError) as e:
                    log.warning("reconcile: %s", e)
                self.stopping.wait(self.opts.reconcile_s)
        finally:
            self.stop_servers()

"""`gpuslice daemon`: the node's single authority over who holds which part
of which GPU."""

from __future__ import annotations

import logging
import os
import threading
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from gpuslice import constants, errors, inventory, simulator, stop_signals
from gpuslice.allocator import container_start, metrics, slice_files
from gpuslice.allocator.compute import ComputeController
from gpuslice.allocator.config import Config
from gpuslice.allocator.driver_limits import DriverLimits
from gpuslice.allocator.driver_memory import NvmlProcessMemory, Reconciler, kill_unsliced
from gpuslice.allocator.membership import MembershipKey
from gpuslice.allocator.runtime_socket import RuntimeSocketServer
from gpuslice.allocator.service import AllocatorService
from gpuslice.allocator.slice_socket import SliceSocketServer
from gpuslice.allocator.slices import SliceManager
from gpuslice.allocator.state_lock import StateLock
from gpuslice.allocator.store import SliceStore
from gpuslice.allocator.unix_socket import UnixSocketServer
from gpuslice.allocator.utilization import NvmlUtilization
from gpuslice.allocator.watcher import ProcessWatcher
from gpuslice.cdi.registry import Registry
from gpuslice.http_json import BoundedHTTPServer
from gpuslice.proto import gpuslice_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

# The slice model is one lock: beyond a few handler threads, more only queue on it
# and on the GIL, and the one holding it waits its turn (32 made Reserve's p99
# under 32 clients 2.3x that of 4: docs/performance.md). Calls past these wait in
# gRPC's own queue, which costs no Python.
GRPC_WORKERS = 4


def _load_nvml(cfg: Config) -> inventory.Inventory:
    if cfg.nvml == "sim":
        simulator.require()
        import gpuslice_sim

        try:
            gpuslice_sim.activate(cfg.sim_config, cfg.sim_state_dir)
        except gpuslice_sim.SimError as e:
            raise errors.InvalidArgument(str(e)) from e  # the config names a machine the simulator refuses
    return inventory.read()


class Daemon:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        cfg.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.lock = StateLock(cfg.state_dir)  # before anything else: a second daemon touches nothing
        self.inventory = _load_nvml(cfg)
        self.store = SliceStore(cfg.store_path, slice_files.on_disk(cfg.slice_files_dir))
        limits = DriverLimits([g.uuid for g in self.inventory.gpus])
        self.manager = SliceManager(
            self.store,
            self.inventory,
            cfg.slice_files_dir,
            cfg.memory_oversubscription,
            cfg.context_reserve,
            limits,
            MembershipKey.load(cfg.state_dir),
        )
        self.watcher = ProcessWatcher()
        self.manager.on_release.append(self.watcher.forget)
        # only slices with processes can launch: the controller looks at those alone
        self.compute = ComputeController(
            self.watcher.files_in_use,
            self.manager.limits_of,
            NvmlUtilization(),
            cfg.compute_period,
            fit_base=cfg.compute_fit_base,
        )
        self.watcher.on_watch.append(self.compute.wake)  # an idle controller ticks at once for a new process
        # the driver's per-process counts against the slices' charges (allocator/driver_memory.py)
        self.reconciler = Reconciler(
            lambda: list(self.watcher.files_in_use().values()),
            NvmlProcessMemory(),
            cfg.driver_memory_period,
            gpus=self.manager.gpus_held,
            owner_of=self.manager.container_files_of,
            on_unsliced=kill_unsliced(self.manager.container_files_of) if cfg.unsliced_processes == "kill" else None,
        )
        self._stop = threading.Event()
        self._server: grpc.Server | None = None
        self._health: health.HealthServicer | None = None
        self._metrics: BoundedHTTPServer | None = None
        self._sockets: list[UnixSocketServer] = []

    def _reattach(self) -> None:
        """Processes that attached before a restart are watched again."""
        for files, slot, pid in self.manager.attached():
            self.watcher.watch(pid, files, slot)

    def _sweeper(self, sockets: list[UnixSocketServer], health_servicer: health.HealthServicer) -> None:
        while not self._stop.wait(self.cfg.sweep_interval):
            lost = self.store.lost()
            if lost:
                # every change would be refused: say so to the probes, once in the log
                log.error("%s; NOT_SERVING until restarted", lost)
                for service in ("", "gpuslice.v1.Allocator"):
                    health_servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
                return
            try:
                self.manager.sweep(self.cfg.reservation_timeout)
                for server in sockets:
                    server.ensure_bound()  # a socket file someone removed comes back
            except Exception:
                log.exception("sweep failed")

    def start(self) -> None:
        """Every socket, the metrics and the controller up; returns once serving."""
        self.manager.restore()
        self.watcher.start()
        self._reattach()
        self.manager.sweep(self.cfg.reservation_timeout)

        # Everything a client may reach is up before the control socket opens; health
        # starts NOT_SERVING (grpc's servicer says SERVING for "" by default).
        if self.cfg.metrics_port:
            metrics.register(self.manager, self.compute)
            self._metrics = metrics.serve(self.cfg.metrics_address, self.cfg.metrics_port)
        self.cfg.socket.parent.mkdir(parents=True, exist_ok=True)
        self.cfg.socket.unlink(missing_ok=True)
        self._server = server = grpc.server(futures.ThreadPoolExecutor(max_workers=GRPC_WORKERS))
        pb_grpc.add_AllocatorServicer_to_server(AllocatorService(self.manager, self.compute), server)
        self._health = health_servicer = health.HealthServicer()
        health_servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        old = os.umask(0o077)  # the control socket is root-only from its first moment
        try:
            server.add_insecure_port(f"unix:{self.cfg.socket}")
            server.start()
        finally:
            os.umask(old)
        slice_server = SliceSocketServer(self.cfg.slice_socket, self.manager, self.watcher)
        slice_server.start()
        host = container_start.Host(self.cfg.host_root, Registry(self.cfg.cdi_dirs))
        runtime_server = RuntimeSocketServer(constants.runtime_socket_beside(self.cfg.socket), self.manager, host,
                                             self.cfg.runtime_request_timeout)  # fmt: skip
        runtime_server.start()
        self._sockets = sockets = [slice_server, runtime_server]
        threading.Thread(target=self._sweeper, args=(sockets, health_servicer), name="sweeper", daemon=True).start()
        self.compute.start()
        self.watcher.on_exit.append(self.reconciler.wake)  # the exited process's driver-side part goes at once
        threading.Thread(target=self.reconciler.run, args=(self._stop,), name="driver-memory", daemon=True).start()
        health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        health_servicer.set("gpuslice.v1.Allocator", health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "serving %d GPUs on %s (slice socket %s); compute budgets every %g s, while fitting costs part of %s",
            len(self.inventory.gpus),
            self.cfg.socket,
            self.cfg.slice_socket,
            self.cfg.compute_period,
            "the slices' mean share (compute_fit_base: even)"
            if self.cfg.compute_fit_base == "even"
            else "each slice's share",
        )

    def wait(self) -> None:
        """Until stopping is asked (request_stop, or SIGTERM/SIGINT under serve)."""
        self._stop.wait()

    def request_stop(self) -> None:
        self._stop.set()

    def stop(self) -> None:
        """Sockets closed, the store closed and the state unlocked; the slices stay
        in the store for the next daemon (a restart or an upgrade loses none)."""
        self._stop.set()
        self.reconciler.wake()  # its thread sees the stop now, not a period later
        if self._health is not None:
            self._health.enter_graceful_shutdown()
        if self._server is not None:
            self._server.stop(2).wait()
        self.compute.stop()
        if self._metrics is not None:
            self._metrics.shutdown()
            self._metrics.server_close()
        for server in reversed(self._sockets):
            server.stop()
        self.watcher.stop()
        self.store.close()
        self.lock.release()

    def serve(self) -> None:
        self.start()
        stop_signals.set_on_signals(self._stop)
        self.wait()
        self.stop()

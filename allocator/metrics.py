"""Prometheus metrics: RPC counts and latencies, reservations, and per GPU /
per slice series collected from the slice store and the slice files at scrape
time.

Every per-slice series carries who it serves as people look for it: the node,
and the Kubernetes namespace, pod and container name (from the CRI's
annotations, the DRA claim, the device plugin's admission; empty outside
Kubernetes), beside the container ID and slice ID that name it to gpuslice."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator
from functools import wraps
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import MetricsHandler
from prometheus_client.registry import REGISTRY, Collector

from gpuslice import errors
from gpuslice.http_json import BoundedHTTPServer

if TYPE_CHECKING:
    from gpuslice.allocator.compute import ComputeController
    from gpuslice.allocator.records import SliceRecord
    from gpuslice.allocator.slices import SliceManager

RPCS = Counter("gpuslice_rpc_total", "gRPC calls by method and status", ["method", "code"])
RPC_SECONDS = Histogram(
    "gpuslice_rpc_duration_seconds",
    "gRPC call latency",
    ["method"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
COMPUTE_TICK_SECONDS = Histogram(
    "gpuslice_compute_tick_seconds",
    "time the compute controller took for one period's measuring, splitting and refilling",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
RESERVATIONS = Counter(
    "gpuslice_reservations_total",
    "slices asked for, by owner kind (container, claim, devices, member) and result (ok, or the refusal's kind)",
    ["kind", "result"],
)
UNSLICED = Counter(
    "gpuslice_unsliced_processes_total",
    "processes found holding memory on a slice's GPU from the slice's container without the interposer "
    "(a libcuda.so.1 of their own): their memory is charged to the slice, their launches are not gated",
    ["gpu"],
)

WORKLOAD = ["node", "namespace", "pod", "container"]
SLICE = [*WORKLOAD, "container_id", "slice"]
P = ParamSpec("P")
T = TypeVar("T")


def node_name() -> str:
    """The node the daemon serves: NODE_NAME (the DaemonSet's downward API), else the host name."""
    return os.environ.get("NODE_NAME", "").strip() or socket.gethostname()


def counted(kind: str) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Count a reservation of `kind` by its result."""

    def wrap(fn: Callable[P, T]) -> Callable[P, T]:
        @wraps(fn)
        def call(*args: P.args, **kwargs: P.kwargs) -> T:
            try:
                got = fn(*args, **kwargs)
            except errors.GpusliceError as e:
                RESERVATIONS.labels(kind, type(e).__name__).inc()
                raise
            RESERVATIONS.labels(kind, "ok").inc()
            return got

        return call

    return wrap


class SliceCollector(Collector):
    def __init__(self, manager: SliceManager, compute: ComputeController | None = None, node: str = "") -> None:
        self.m = manager
        self.compute = compute
        self.node = node or node_name()

    def _who(self, r: SliceRecord) -> list[str]:
        w = r.workload
        return [self.node, w.namespace, w.pod, w.container, r.container_id, r.id]

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield from self._gpus()
        yield from self._slices()

    def _gpus(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["node", "gpu", "uuid"]
        fits = CounterMetricFamily(
            "gpuslice_gpu_compute_fits",
            "fits of the costs of the slices on the GPU begun: as one joined, or as what the GPU did drifted off them",
            labels=[*labels, "reason"],
        )
        total = GaugeMetricFamily("gpuslice_gpu_memory_total_bytes", "GPU memory", labels=labels)
        reserved = GaugeMetricFamily("gpuslice_gpu_memory_reserved_bytes", "GPU memory held by slices", labels=labels)
        cores = GaugeMetricFamily("gpuslice_gpu_cores_reserved", "compute shares held (percent)", labels=labels)
        slices = GaugeMetricFamily("gpuslice_gpu_slices", "slices on the GPU", labels=labels)
        for c in self.m.capacities():
            values = [self.node, str(c.index), c.uuid]
            total.add_metric(values, c.memory_total)
            reserved.add_metric(values, c.memory_reserved)
            cores.add_metric(values, c.cores_reserved)
            slices.add_metric(values, c.slices)
            for reason in ("join", "drift"):
                fits.add_metric([*values, reason], self.compute.fits.get((c.uuid, reason), 0) if self.compute else 0)
        yield from (total, reserved, cores, slices, fits)

    def _slices(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        per_gpu = [*SLICE, "gpu"]
        limit = GaugeMetricFamily("gpuslice_slice_memory_limit_bytes", "slice memory limit", labels=per_gpu)
        cores = GaugeMetricFamily("gpuslice_slice_cores", "compute share asked (percent of the GPU)", labels=per_gpu)
        used = GaugeMetricFamily("gpuslice_slice_memory_used_bytes", "slice memory in use, all GPUs", labels=SLICE)
        procs = GaugeMetricFamily("gpuslice_slice_processes", "processes attached", labels=SLICE)
        driver = GaugeMetricFamily(
            "gpuslice_slice_driver_enforced", "1 when the driver enforces the slice's memory limit too", labels=SLICE
        )
        throttled = CounterMetricFamily(
            "gpuslice_slice_throttled_launches",
            "kernel launches that waited for the slice's compute budget",
            labels=per_gpu,
        )
        refused = CounterMetricFamily(
            "gpuslice_slice_oom_refusals", "allocations refused at the slice's memory limit", labels=per_gpu
        )
        driver_side = GaugeMetricFamily(
            "gpuslice_slice_driver_side_memory_bytes",
            "memory the driver holds for the slice's processes beyond what they charged (part of what it uses)",
            labels=per_gpu,
        )
        over = GaugeMetricFamily(
            "gpuslice_slice_memory_over_limit_bytes", "how far past its memory limit the slice is", labels=per_gpu
        )
        target = GaugeMetricFamily(
            "gpuslice_slice_compute_target_ratio", "share of the GPU the controller aims at", labels=per_gpu
        )
        got = GaugeMetricFamily(
            "gpuslice_slice_compute_used_ratio", "share of the GPU used, over about a second", labels=per_gpu
        )
        fitting = GaugeMetricFamily(
            "gpuslice_slice_compute_fitting",
            "1 while the costs of the slices on its GPU are fitted (part of its share meanwhile)",
            labels=per_gpu,
        )
        for v in self.m.views():
            r, who = v.record, self._who(v.record)
            # per GPU of the slice: shares of one GPU add up, as in its slice files (one series each)
            index = {a.gpu_uuid: str(a.gpu_index) for a in r.allocations}
            for uuid in r.file_gpus:
                shares = [a for a in r.allocations if a.gpu_uuid == uuid]
                limit.add_metric([*who, index[uuid]], sum(a.memory for a in shares))
                cores.add_metric([*who, index[uuid]], min(100, sum(a.cores for a in shares)))
            used.add_metric(who, v.memory_used)
            procs.add_metric(who, v.processes)
            driver.add_metric(who, 1 if v.enforcement.startswith("driver") else 0)
            in_files = [index[u] for u in r.file_gpus]
            for gpu, (waits, refusals) in zip(in_files, self.m.counters(r), strict=False):
                throttled.add_metric([*who, gpu], waits)
                refused.add_metric([*who, gpu], refusals)
            for gpu, extra in zip(in_files, v.driver_side, strict=False):
                driver_side.add_metric([*who, gpu], extra)
            for gpu, past in zip(in_files, v.over_limit, strict=False):
                over.add_metric([*who, gpu], past)
            for g, gpu in enumerate(in_files):
                t, u = self.compute.view(r.id, g) if self.compute is not None else (0.0, 0.0)
                if t or u:
                    target.add_metric([*who, gpu], t)
                    got.add_metric([*who, gpu], u)
                    fitting.add_metric([*who, gpu], 1 if self.compute and self.compute.fitting(r.id, g) else 0)
        yield from (limit, cores, used, procs, driver, throttled, refused, driver_side, over, target, got, fitting)


def register(manager: SliceManager, compute: ComputeController | None = None, node: str = "") -> None:
    REGISTRY.register(SliceCollector(manager, compute, node))


class _Handler(MetricsHandler):
    timeout = 10  # a scraper that connects and sends nothing, or stalls, cannot hold a thread
    disable_nagle_algorithm = True


def serve(address: str, port: int) -> BoundedHTTPServer:
    """The registry over HTTP on its own thread, as prometheus_client's
    start_http_server serves it, but with connections bounded and timed out: its
    server starts a thread for every connection and keeps each for as long as the
    caller leaves it open, so idle connections from anywhere the port is reachable
    would grow the daemon's threads without end."""
    server = BoundedHTTPServer((address, port), _Handler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server

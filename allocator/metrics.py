"""Prometheus metrics: RPC counts and latencies, and per GPU / per slice
gauges collected from the slice store at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

RPCS = Counter("gpuslice_rpc_total", "gRPC calls by method and status", ["method", "code"])
RPC_SECONDS = Histogram(
    "gpuslice_rpc_duration_seconds",
    "gRPC call latency",
    ["method"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)


class SliceCollector(Collector):
    def __init__(self, manager, compute=None) -> None:
        self.m = manager
        self.compute = compute

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gpu_total = GaugeMetricFamily("gpuslice_gpu_memory_total_bytes", "GPU memory", labels=["gpu", "uuid"])
        gpu_reserved = GaugeMetricFamily(
            "gpuslice_gpu_memory_reserved_bytes", "GPU memory held by slices", labels=["gpu", "uuid"]
        )
        gpu_cores = GaugeMetricFamily("gpuslice_gpu_cores_reserved", "compute shares held", labels=["gpu", "uuid"])
        gpu_slices = GaugeMetricFamily("gpuslice_gpu_slices", "slices on the GPU", labels=["gpu", "uuid"])
        for c in self.m.capacities():
            labels = [str(c.index), c.uuid]
            gpu_total.add_metric(labels, c.memory_total)
            gpu_reserved.add_metric(labels, c.memory_reserved)
            gpu_cores.add_metric(labels, c.cores_reserved)
            gpu_slices.add_metric(labels, c.slices)
        lim = GaugeMetricFamily(
            "gpuslice_slice_memory_limit_bytes", "slice memory limit", labels=["container", "slice", "gpu"]
        )
        used = GaugeMetricFamily(
            "gpuslice_slice_memory_used_bytes", "slice memory in use", labels=["container", "slice"]
        )
        cores = GaugeMetricFamily("gpuslice_slice_cores", "slice compute share", labels=["container", "slice", "gpu"])
        procs = GaugeMetricFamily("gpuslice_slice_processes", "processes attached", labels=["container", "slice"])
        driver = GaugeMetricFamily(
            "gpuslice_slice_driver_enforced", "1 when the driver enforces the slice's memory limit too",
            labels=["container", "slice"],
        )  # fmt: skip
        for v in self.m.views():
            r = v.record
            for a in r.allocations:
                lim.add_metric([r.container_id, r.id, str(a.gpu_index)], a.memory)
                cores.add_metric([r.container_id, r.id, str(a.gpu_index)], a.cores)
            used.add_metric([r.container_id, r.id], v.memory_used)
            procs.add_metric([r.container_id, r.id], v.processes)
            driver.add_metric([r.container_id, r.id], 1 if v.enforcement.startswith("driver") else 0)
        yield from (gpu_total, gpu_reserved, gpu_cores, gpu_slices, lim, used, cores, procs, driver)
        yield from self._compute()

    def _compute(self) -> Iterator[GaugeMetricFamily]:
        target = GaugeMetricFamily(
            "gpuslice_slice_compute_target_ratio", "share of the GPU the controller aims at", labels=["slice", "gpu"]
        )
        used = GaugeMetricFamily(
            "gpuslice_slice_compute_used_ratio", "share of the GPU used in the last period", labels=["slice", "gpu"]
        )
        for sid, g, t, u in self.compute.report() if self.compute else ():
            target.add_metric([sid, str(g)], t)
            used.add_metric([sid, str(g)], u)
        yield from (target, used)


def register(manager, compute=None) -> None:
    REGISTRY.register(SliceCollector(manager, compute))

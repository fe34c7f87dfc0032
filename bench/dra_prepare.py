"""NodePrepareResources as the kubelet calls it: the plugin (`gpuslice
kubelet-plugin`, its own process) against a daemon on the simulator and a
stand-in API server, driven over gRPC. p50/p99 for 1 and 8 claims per call,
side by side with the floor it is built on: the daemon's Reserve + Release.
DESIGN's budget: p99 <= 50 ms for one claim."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import grpc

from bench import node
from gpuslice.cli import sim_daemon
from gpuslice.proto import kubelet_dra_v1_pb2 as pb
from gpuslice.proto import kubelet_dra_v1_pb2_grpc as pb_grpc
from tools.dra_node import PluginNode, allocated

ROUNDS = {1: 200, 8: 40}


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def main() -> None:
    with node([{"memory": "80Gi"}]) as d, tempfile.TemporaryDirectory(prefix="gpuslice-bench-dra-") as tmp:
        work = Path(tmp)
        spec = work / "gpuslice.json"
        made = sim_daemon.cdi_generate(d, spec)
        assert made.returncode == 0, made.stderr
        dra = PluginNode(d, spec, work, work / "cdi")
        dra.start_plugin()
        client = d.client()
        try:
            with grpc.insecure_channel(f"unix://{dra.endpoint}") as channel:
                stub = pb_grpc.DRAPluginStub(channel)
                floor = []
                for i in range(ROUNDS[1]):
                    t = time.perf_counter()
                    client.reserve(f"floor-{i}", {"gpuslice.io/memory": "256Mi"})
                    client.release(f"floor-{i}")
                    floor.append((time.perf_counter() - t) * 1e3)
                print(f"daemon Reserve + Release (the floor): p50 {p(floor, 50):.2f} ms, p99 {p(floor, 99):.2f} ms")
                for per_call, rounds in ROUNDS.items():
                    times = []
                    for r in range(rounds):
                        claims = [allocated(f"c{r}-{i}", ("gpu-0", "256Mi", None)) for i in range(per_call)]
                        for c in claims:
                            dra.api.put_claim(c)
                        refs = [
                            pb.Claim(uid=c["metadata"]["uid"], namespace="ml", name=c["metadata"]["name"])
                            for c in claims
                        ]
                        t = time.perf_counter()
                        reply = stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=refs), timeout=30)
                        times.append((time.perf_counter() - t) * 1e3)
                        assert all(not a.error for a in reply.claims.values()), reply
                        stub.NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(claims=refs), timeout=30)
                    print(f"NodePrepareResources, {per_call} claim(s) per call, {rounds} calls: "
                          f"p50 {p(times, 50):.2f} ms, p99 {p(times, 99):.2f} ms "
                          f"({p(times, 99) / p(floor, 99):.1f}x the floor's p99)"
                          + ("; budget p99 <= 50 ms: " + ("met" if p(times, 99) <= 50 else "NOT met")
                             if per_call == 1 else ""))  # fmt: skip
        finally:
            dra.close()

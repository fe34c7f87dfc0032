"""GetPreferredAllocation and Allocate as the kubelet calls them: the device
plugin (`gpuslice device-plugin`, its own process, identifying the container
from the pod-resources service and the API server) against a daemon on the
simulator, driven over gRPC by a minimal kubelet here (registration,
pod-resources). Each pod's one container asks 1 GiB and 1 % of compute: two
resources, each a GetPreferredAllocation then an Allocate. p50/p99 side by
side with the floor: the daemon's Reserve + Release. Issue 28's budget: each
call's p99 under 20 ms."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent import futures
from pathlib import Path

import grpc

from bench import node
from bench.dra_prepare import p
from gpuslice.device_plugin import units as u
from gpuslice.proto import kubelet_deviceplugin_v1beta1_pb2 as dp
from gpuslice.proto import kubelet_deviceplugin_v1beta1_pb2_grpc as dp_grpc
from gpuslice.proto import kubelet_podresources_v1_pb2 as pr
from gpuslice.proto import kubelet_podresources_v1_pb2_grpc as pr_grpc
from tools.api_server import ApiServer

PODS = 200
ALIVE = 40  # pods kept; older ones are deleted (the plugin's reconcile releases them)
ASK = {u.MEMORY: 1, u.CORES: 1}


class Kubelet(dp_grpc.RegistrationServicer, pr_grpc.PodResourcesListerServicer):
    def __init__(self) -> None:
        self.registered: dict[str, str] = {}
        self.held: dict[str, dict[str, list[str]]] = {}  # "ns/name" -> resource -> IDs
        self.units: dict[str, list[str]] = {}
        self.lock = threading.Lock()

    def Register(self, request, context):
        self.registered[request.resource_name] = request.endpoint
        return dp.Empty()

    def List(self, request, context):
        with self.lock:
            pods = [pr.PodResources(namespace=k.split("/")[0], name=k.split("/")[1], containers=[pr.ContainerResources(
                name="c0", devices=[pr.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in per.items()])])
                for k, per in self.held.items()]  # fmt: skip
        return pr.ListPodResourcesResponse(pod_resources=pods)

    def GetAllocatableResources(self, request, context):
        return pr.AllocatableResourcesResponse(
            devices=[pr.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in self.units.items()]
        )

    def available(self, resource: str) -> list[str]:
        with self.lock:
            taken = {d for per in self.held.values() for d in per.get(resource, ())}
        return [d for d in self.units[resource] if d not in taken]


def main() -> None:
    with node([{"memory": "80Gi"}, {"memory": "80Gi"}]) as d, tempfile.TemporaryDirectory(prefix="gpuslice-dp-") as t:
        work = Path(t)
        gpus = d.client().inventory().gpus
        kubelet = Kubelet()
        kubelet.units = {r: [x.id for g in gpus for x in u.units(g.uuid, r, g.memory_total)] for r in ASK}
        plugin_dir, pod_resources = work / "device-plugins", work / "pod-resources.sock"
        plugin_dir.mkdir()
        server = grpc.server(futures.ThreadPoolExecutor(4))
        dp_grpc.add_RegistrationServicer_to_server(kubelet, server)
        pr_grpc.add_PodResourcesListerServicer_to_server(kubelet, server)
        server.add_insecure_port(f"unix://{plugin_dir / 'kubelet.sock'}")
        server.add_insecure_port(f"unix://{pod_resources}")
        server.start()
        api = ApiServer()
        plugin = subprocess.Popen(
            [sys.executable, "-m", "gpuslice.cli", "device-plugin", "--node-name", "bench", "--kubeconfig",
             str(api.kubeconfig(work / "kubeconfig")), "--socket", str(d.socket), "--plugin-dir", str(plugin_dir),
             "--pod-resources", str(pod_resources), "--reconcile", "0.5"],
            stdout=subprocess.DEVNULL, stderr=open(work / "plugin.log", "w"),  # noqa: SIM115 - the child's
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while len(kubelet.registered) < 3:
                assert plugin.poll() is None and time.monotonic() < deadline, (work / "plugin.log").read_text()
                time.sleep(0.05)
            stubs = {
                r: dp_grpc.DevicePluginStub(grpc.insecure_channel(f"unix://{plugin_dir / kubelet.registered[r]}"))
                for r in ASK
            }
            client = d.client()
            floor = []
            for i in range(PODS):
                start = time.perf_counter()
                client.reserve(f"floor-{i}", {"gpuslice.io/memory": "1Gi"})
                client.release(f"floor-{i}")
                floor.append((time.perf_counter() - start) * 1e3)
            prefer: list[float] = []
            allocate: list[float] = []
            alive: list[tuple[str, str]] = []
            for i in range(PODS):
                name, uid = f"p{i}", str(uuid.uuid4())
                limits = {r: str(n) for r, n in ASK.items()}
                container = {"name": "c0", "image": "x", "resources": {"limits": limits, "requests": limits}}
                api.put_pod({"apiVersion": "v1", "kind": "Pod", "status": {"phase": "Pending"},
                             "metadata": {"name": name, "namespace": "bench", "uid": uid},
                             "spec": {"nodeName": "bench", "containers": [container]}})  # fmt: skip
                with kubelet.lock:
                    kubelet.held[f"bench/{name}"] = {}
                for r, n in ASK.items():
                    req = dp.PreferredAllocationRequest(container_requests=[dp.ContainerPreferredAllocationRequest(
                        available_deviceIDs=kubelet.available(r), allocation_size=n)])  # fmt: skip
                    start = time.perf_counter()
                    ids = list(stubs[r].GetPreferredAllocation(req, timeout=30).container_responses[0].deviceIDs)
                    prefer.append((time.perf_counter() - start) * 1e3)
                    start = time.perf_counter()
                    stubs[r].Allocate(
                        dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)]),
                        timeout=30,
                    )
                    allocate.append((time.perf_counter() - start) * 1e3)
                    with kubelet.lock:
                        kubelet.held[f"bench/{name}"][r] = ids
                api.set_phase(uid, "Running")
                alive.append((name, uid))
                if len(alive) > ALIVE:
                    gone, _ = alive.pop(0)
                    with kubelet.lock:
                        del kubelet.held[f"bench/{gone}"]
            print(f"daemon Reserve + Release (the floor): p50 {p(floor, 50):.2f} ms, p99 {p(floor, 99):.2f} ms")
            for label, times in (("GetPreferredAllocation", prefer), ("Allocate", allocate)):
                print(
                    f"{label}, {len(times)} calls (identifying the container through pod-resources and the API): "
                    f"p50 {p(times, 50):.2f} ms, p99 {p(times, 99):.2f} ms ({p(times, 99) / p(floor, 99):.1f}x the "
                    f"floor's p99); budget p99 < 20 ms: {'met' if p(times, 99) < 20 else 'NOT met'}"
                )
        finally:
            plugin.terminate()
            plugin.wait(20)
            server.stop(0)
            api.stop()

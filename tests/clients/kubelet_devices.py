"""A stand-in kubelet device manager, over the kubelet's own protos
(deviceplugin/v1beta1 and podresources/v1 descriptor sets compiled from the
official files, loaded into a pool of their own), in its own process.

It follows kubernetes/kubernetes pkg/kubelet/cm/devicemanager:
- `Start`: removes everything in the device-plugins directory but its
  checkpoint (`removeContents`), reads the checkpoint
  (`kubelet_internal_checkpoint`: pod devices with their Allocate answers),
  and serves Registration on kubelet.sock;
- `Register` (plugin_watcher / endpoint.go): checks the version, dials the
  plugin's endpoint, reads its options and runs ListAndWatch, keeping the
  healthy and unhealthy device IDs per resource; a stream that ends marks the
  resource's devices unhealthy;
- `Allocate(pod, container)` -> `allocateContainerResources`: per container in
  order (init containers first), per resource of its limits in Go map order
  (random here, seeded), `UpdateAllocatedDevices` (devices of inactive pods
  freed), `devicesToAllocate`: a container's devices kept are reused (a
  restart calls no plugin), else available = healthy - allocated, "requested
  number of devices unavailable" when short, GetPreferredAllocation
  (available, must-include, size) outside the lock, an error failing the
  admission, its answer taken where it is valid and any available units
  otherwise; then Allocate, `podDevices.insert` and the checkpoint written;
- a failed admission rejects the pod (UnexpectedAdmissionError: "Allocate
  failed due to ..., which is unexpected"), which makes it inactive;
- `GetDeviceRunContainerOptions`: a container's options from the kept answers;
- the pod-resources service (podresources/v1 List, GetAllocatableResources):
  the pod manager's pods, including the one being admitted (the kubelet adds a
  pod before admitting it, kubelet.go HandlePodAdditions), and their devices.

Each device's topology (its NUMA nodes) is kept and shown in the state, not aligned to.
Left out: topology alignment (the Topology Manager), init containers' device reuse, PreStartContainer.

  kubelet_devices.py PROTOS DEVICE_PLUGIN_DIR POD_RESOURCES_SOCKET STATE_DIR SEED

prints one JSON line, {"control": PORT}, then serves an HTTP control API on
127.0.0.1:PORT: POST /admit (a pod), POST /delete {"uid"}, GET /options?uid=&container=,
GET /state."""

from __future__ import annotations

import base64
import json
import os
import random
import sys
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import grpc
from google.protobuf import message_factory
from google.protobuf.json_format import MessageToDict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kubelet_dra import Api

CHECKPOINT = "kubelet_internal_checkpoint"
DP = "v1beta1"


class Endpoint:
    def __init__(self, manager: DeviceManager, resource: str, socket: Path) -> None:
        self.resource = resource
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.m = manager
        self.options = self.call("GetDevicePluginOptions", manager.dp.message("Empty"), 10)
        self.thread = threading.Thread(target=self.watch, daemon=True)
        self.thread.start()

    def call(self, method: str, request: Any, timeout: float) -> Any:
        return self.m.dp.call(self.channel, "DevicePlugin", method, request, timeout)

    def watch(self) -> None:
        m = self.m.dp.file.services_by_name["DevicePlugin"].methods_by_name["ListAndWatch"]
        reply = message_factory.GetMessageClass(m.output_type)
        stream = self.channel.unary_stream(
            f"/{m.containing_service.full_name}/ListAndWatch",
            request_serializer=lambda r: r.SerializeToString(),
            response_deserializer=reply.FromString,
        )
        try:
            for update in stream(self.m.dp.message("Empty")):
                with self.m.lock:
                    self.m.healthy[self.resource] = {d.ID for d in update.devices if d.health == "Healthy"}
                    self.m.unhealthy[self.resource] = {d.ID for d in update.devices if d.health != "Healthy"}
                    self.m.updates[self.resource] = self.m.updates.get(self.resource, 0) + 1
                    self.m.topology[self.resource] = {d.ID: [n.ID for n in d.topology.nodes]
                                                      for d in update.devices if d.HasField("topology")}  # fmt: skip
        except grpc.RpcError:
            pass
        with self.m.lock:  # endpoint stopped: its devices unhealthy (markResourceUnhealthy)
            if self.m.endpoints.get(self.resource) is self:
                self.m.unhealthy[self.resource] = self.m.healthy.get(self.resource, set()) | self.m.unhealthy.get(
                    self.resource, set()
                )
                self.m.healthy[self.resource] = set()


class Rejected(Exception):
    pass


class DeviceManager:
    def __init__(self, protos: Path, plugin_dir: Path, state: Path, seed: int) -> None:
        self.dp = Api(protos, "deviceplugin")
        self.pr = Api(protos, "podresources")
        self.plugin_dir = plugin_dir
        self.state = state
        self.rng = random.Random(seed)
        self.lock = threading.RLock()
        self.admit_lock = threading.Lock()  # the kubelet's sync loop admits one pod at a time
        self.healthy: dict[str, set[str]] = {}
        self.unhealthy: dict[str, set[str]] = {}
        self.topology: dict[str, dict[str, list[int]]] = {}  # the NUMA nodes each device names, by resource
        self.updates: dict[str, int] = {}
        self.endpoints: dict[str, Endpoint] = {}
        # pod UID -> container -> resource -> {"ids": [...], "resp": base64 of the AllocateResponse's container answer}
        self.pod_devices: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
        self.pods: dict[str, dict[str, Any]] = {}  # the pod manager: UID -> pod (with our "phase")
        self._load()

    # -- persistence -------------------------------------------------------------------------------
    def _load(self) -> None:
        for entry in self.plugin_dir.iterdir() if self.plugin_dir.exists() else ():
            if entry.name != CHECKPOINT:  # removeContents: every plugin socket goes at the kubelet's start
                entry.unlink()
        path = self.plugin_dir / CHECKPOINT
        if path.exists():
            data = json.loads(path.read_text())["Data"]
            for e in data["PodDeviceEntries"]:
                per = self.pod_devices.setdefault(e["PodUID"], {}).setdefault(e["ContainerName"], {})
                per[e["ResourceName"]] = {"ids": e["DeviceIDs"]["-1"], "resp": e["AllocResp"]}
            for resource in data["RegisteredDevices"]:  # capacity stays 0 until the plugin registers again
                self.healthy[resource], self.unhealthy[resource] = set(), set()
        pods = self.state / "pods.json"  # the API server's pods bound here, which a restarted kubelet reads
        if pods.exists():
            self.pods = json.loads(pods.read_text())

    def _checkpoint(self) -> None:
        entries = [
            {"PodUID": uid, "ContainerName": c, "ResourceName": r, "DeviceIDs": {"-1": v["ids"]},
             "AllocResp": v["resp"]}
            for uid, per in self.pod_devices.items() for c, res in per.items() for r, v in res.items()
        ]  # fmt: skip
        data = {"PodDeviceEntries": entries, "RegisteredDevices": {r: sorted(d) for r, d in self.healthy.items()}}
        tmp = self.plugin_dir / (CHECKPOINT + ".tmp")
        tmp.write_text(json.dumps({"Data": data, "Checksum": 0}))
        os.replace(tmp, self.plugin_dir / CHECKPOINT)
        (self.state / "pods.json").write_text(json.dumps(self.pods))

    # -- registration ------------------------------------------------------------------------------
    def register(self, request: Any) -> None:
        if request.version != DP:
            raise ValueError(f"unsupported version {request.version}")
        endpoint = Endpoint(self, request.resource_name, self.plugin_dir / request.endpoint)
        with self.lock:
            self.endpoints[request.resource_name] = endpoint

    # -- admission -------------------------------------------------------------------------------------
    def active(self) -> set[str]:
        return {uid for uid, p in self.pods.items() if p["phase"] not in ("Failed", "Succeeded")}

    def update_allocated(self) -> None:
        with self.lock:
            for uid in [u for u in self.pod_devices if u not in self.active()]:
                del self.pod_devices[uid]

    def allocated(self, resource: str) -> set[str]:
        held = [res.get(resource, {}) for per in self.pod_devices.values() for res in per.values()]
        return {d for h in held for d in h.get("ids", ())}

    def admit(self, pod: dict[str, Any]) -> dict[str, Any]:
        uid = pod["metadata"]["uid"]
        with self.admit_lock:
            with self.lock:
                self.pods[uid] = {"pod": pod, "phase": "Pending"}  # podManager.AddPod, before canAdmitPod
            try:
                spec = pod["spec"]
                for c in [*(spec.get("initContainers") or ()), *spec["containers"]]:
                    self.allocate_container(uid, c)
            except Rejected as e:
                with self.lock:
                    self.pods[uid]["phase"] = "Failed"
                    self._checkpoint()
                return {"admitted": False, "reason": "UnexpectedAdmissionError",
                        "message": f"Allocate failed due to {e}, which is unexpected"}  # fmt: skip
            with self.lock:
                self.pods[uid]["phase"] = "Running"
                self._checkpoint()
        return {"admitted": True}

    def allocate_container(self, uid: str, c: dict[str, Any]) -> None:
        limits = (c.get("resources") or {}).get("limits") or {}
        ours = [r for r in limits if r in self.endpoints or r in self.healthy]
        self.rng.shuffle(ours)  # Go's map order
        if ours:
            self.update_allocated()
        for resource in ours:
            needed = int(limits[resource])
            with self.lock:
                kept = self.pod_devices.get(uid, {}).get(c["name"], {}).get(resource)
                if kept:
                    if len(kept["ids"]) != needed:
                        raise Rejected(f"pod {uid} container {c['name']} changed request for resource {resource}")
                    continue
                endpoint = self.endpoints.get(resource)
                if endpoint is None or resource not in self.healthy:
                    raise Rejected(f"cannot allocate unregistered device {resource}")
                available = self.healthy[resource] - self.allocated(resource)
                if len(available) < needed:
                    raise Rejected(
                        f"requested number of devices unavailable for {resource}. Requested: {needed}, "
                        f"Available: {len(available)}"
                    )
            chosen: set[str] = set()
            if endpoint.options.get_preferred_allocation_available:
                req = self.dp.message("PreferredAllocationRequest", container_requests=[self.dp.message(
                    "ContainerPreferredAllocationRequest", available_deviceIDs=sorted(available),
                    must_include_deviceIDs=[], allocation_size=needed)])  # fmt: skip
                try:
                    reply = endpoint.call("GetPreferredAllocation", req, 30)
                except grpc.RpcError as e:
                    raise Rejected(f"rpc error: code = {e.code().name} desc = {e.details()}") from e
                preferred = set(reply.container_responses[0].deviceIDs) & available
                if len(preferred) >= needed:
                    chosen = set(sorted(preferred)[:needed])
            if not chosen:
                chosen = set(self.rng.sample(sorted(available), needed))
            with self.lock:
                if chosen & self.allocated(resource):
                    raise Rejected(f"devices {sorted(chosen)} taken meanwhile")
            req = self.dp.message(
                "AllocateRequest",
                container_requests=[self.dp.message("ContainerAllocateRequest", devices_ids=sorted(chosen))],
            )
            try:
                reply = endpoint.call("Allocate", req, 30)
            except grpc.RpcError as e:
                raise Rejected(f"rpc error: code = {e.code().name} desc = {e.details()}") from e
            answer = reply.container_responses[0]
            with self.lock:
                self.pod_devices.setdefault(uid, {}).setdefault(c["name"], {})[resource] = {
                    "ids": sorted(chosen),
                    "resp": base64.b64encode(answer.SerializeToString()).decode(),
                }
                self._checkpoint()

    def options(self, uid: str, container: str) -> dict[str, Any]:
        """GetDeviceRunContainerOptions: envs, CDI devices, mounts, devices and annotations, merged."""
        out: dict[str, Any] = {"envs": {}, "cdi_devices": [], "annotations": {}, "mounts": [], "devices": []}
        m = self.dp.file.message_types_by_name["ContainerAllocateResponse"]
        cls = message_factory.GetMessageClass(m)
        with self.lock:
            per = self.pod_devices.get(uid, {}).get(container, {})
            for resource in sorted(per):
                answer = cls.FromString(base64.b64decode(per[resource]["resp"]))
                d = MessageToDict(answer, preserving_proto_field_name=True)
                out["envs"].update(d.get("envs", {}))
                out["annotations"].update(d.get("annotations", {}))
                for cdi in d.get("cdi_devices", []):
                    if cdi["name"] not in out["cdi_devices"]:
                        out["cdi_devices"].append(cdi["name"])
                out["mounts"] += d.get("mounts", [])
                out["devices"] += d.get("devices", [])
        return out

    def delete(self, uid: str) -> None:
        with self.lock:
            self.pods.pop(uid, None)
            self._checkpoint()

    def state_dict(self) -> dict[str, Any]:
        with self.lock:
            return {
                "capacity": {r: len(self.healthy.get(r, ())) + len(self.unhealthy.get(r, ())) for r in self.healthy},
                "allocatable": {r: len(d) for r, d in self.healthy.items()},
                "updates": dict(self.updates),
                "topology": {r: dict(t) for r, t in self.topology.items()},
                "pod_devices": self.pod_devices,
                "pods": {uid: p["phase"] for uid, p in self.pods.items()},
            }

    # -- pod-resources -----------------------------------------------------------------------------
    def list_pods(self, request: Any, context: Any) -> Any:
        self.update_allocated()
        pods = []
        with self.lock:
            for uid in sorted(self.active()):
                pod = self.pods[uid]["pod"]
                containers = []
                spec = pod["spec"]
                for c in [*(spec.get("initContainers") or ()), *spec["containers"]]:
                    per = self.pod_devices.get(uid, {}).get(c["name"], {})
                    devices = [
                        self.pr.message("ContainerDevices", resource_name=r, device_ids=v["ids"])
                        for r, v in sorted(per.items())
                    ]
                    containers.append(self.pr.message("ContainerResources", name=c["name"], devices=devices))
                meta = pod["metadata"]
                pods.append(self.pr.message("PodResources", name=meta["name"], namespace=meta["namespace"],
                                            containers=containers))  # fmt: skip
        return self.pr.message("ListPodResourcesResponse", pod_resources=pods)

    def allocatable(self, request: Any, context: Any) -> Any:
        with self.lock:
            devices = [
                self.pr.message("ContainerDevices", resource_name=r, device_ids=sorted(d))
                for r, d in sorted(self.healthy.items())
            ]
        return self.pr.message("AllocatableResourcesResponse", devices=devices)


def _service(api: Api, name: str, handlers: dict[str, Any]) -> grpc.GenericRpcHandler:
    svc = api.file.services_by_name[name]
    methods = {}
    for method, fn in handlers.items():
        m = svc.methods_by_name[method]
        req = message_factory.GetMessageClass(m.input_type)
        methods[method] = grpc.unary_unary_rpc_method_handler(
            fn, request_deserializer=req.FromString, response_serializer=lambda r: r.SerializeToString()
        )
    return grpc.method_handlers_generic_handler(svc.full_name, methods)


def control(m: DeviceManager) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, body: dict[str, Any], code: int = 200) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict[str, Any]:
            return json.loads(self.rfile.read(int(self.headers["Content-Length"])))

        def do_POST(self) -> None:
            if self.path == "/admit":
                return self._send(m.admit(self._body()))
            if self.path == "/delete":
                m.delete(self._body()["uid"])
                return self._send({})
            self._send({"error": "no such path"}, 404)

        def do_GET(self) -> None:
            url = urlparse(self.path)
            q = {k: v[0] for k, v in parse_qs(url.query).items()}
            if url.path == "/options":
                return self._send(m.options(q["uid"], q["container"]))
            if url.path == "/state":
                return self._send(m.state_dict())
            self._send({"error": "no such path"}, 404)

    return ThreadingHTTPServer(("127.0.0.1", 0), Handler)


def main() -> None:
    protos, plugin_dir, pod_resources, state, seed = sys.argv[1:6]
    m = DeviceManager(Path(protos), Path(plugin_dir), Path(state), int(seed))
    m.plugin_dir.mkdir(parents=True, exist_ok=True)
    server = grpc.server(futures.ThreadPoolExecutor(8))

    def register(request: Any, context: Any) -> Any:
        try:
            m.register(request)
        except (ValueError, grpc.RpcError) as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return m.dp.message("Empty")

    server.add_generic_rpc_handlers([_service(m.dp, "Registration", {"Register": register})])
    server.add_insecure_port(f"unix://{plugin_dir}/kubelet.sock")
    lister = grpc.server(futures.ThreadPoolExecutor(4))
    lister.add_generic_rpc_handlers(
        [_service(m.pr, "PodResourcesLister", {"List": m.list_pods, "GetAllocatableResources": m.allocatable})]
    )
    Path(pod_resources).parent.mkdir(parents=True, exist_ok=True)
    Path(pod_resources).unlink(missing_ok=True)
    lister.add_insecure_port(f"unix://{pod_resources}")
    http = control(m)
    server.start()
    lister.start()
    threading.Thread(target=http.serve_forever, daemon=True).start()
    print(json.dumps({"control": http.server_address[1]}), flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()

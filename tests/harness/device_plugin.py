"""A node for the device plugin's tests: the daemon on the simulator,
`gpuslice device-plugin` (its own process), the stand-in kubelet device
manager (tests/clients/kubelet_devices.py, its own process, over the official
protos) and the stand-in API server holding the node's pods."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from gpuslice.cli.sim_daemon import RunningDaemon
from gpuslice.proto import gpuslice_pb2 as pb
from tests.harness import CLIENTS, REPO
from tests.harness.kubelet_api import write_descriptor_sets
from tools.api_server import ApiServer

NODE = "node-a"
RESOURCES = ("gpuslice.io/memory", "gpuslice.io/cores", "gpuslice.io/gpu")


def pod(name: str, *containers: dict[str, int] | tuple[str, dict[str, int]], namespace: str = "default",
        annotations: dict[str, str] | None = None, env: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """A pod bound to NODE whose containers ask these limits ({"memory": 8, "cores": 30}); a
    container is (name, limits) or limits alone (named c0, c1, ...); `env`, each container's."""
    spec = []
    for i, c in enumerate(containers):
        cname, limits = c if isinstance(c, tuple) else (f"c{i}", c)
        full = {f"gpuslice.io/{k}": str(v) for k, v in limits.items()}
        spec.append({"name": cname, "image": "busybox", "resources": {"limits": full, "requests": full}})
        if env:
            spec[-1]["env"] = [{"name": k, "value": v} for k, v in env.items()]
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": str(uuid.uuid4())}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"nodeName": NODE, "containers": spec},
            "status": {"phase": "Pending"}}  # fmt: skip


class DevicePluginNode:
    def __init__(self, d: RunningDaemon, tmp: Path, seed: int = 0, gpuslice: list[str] | None = None) -> None:
        self.d = d
        self.tmp = tmp
        self.seed = seed
        self.gpuslice = gpuslice or [sys.executable, "-m", "gpuslice.cli"]
        self.plugin_args: list[str] = []
        self.api = ApiServer()
        self.api.put_node(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {"gpuslice.io/node": "true"}}}
        )
        self.kubeconfig = self.api.kubeconfig(tmp / "kubeconfig")
        self.dir = tmp / "device-plugins"
        self.pod_resources = tmp / "pod-resources" / "kubelet.sock"
        self.state = tmp / "kubelet-state"
        self.state.mkdir(exist_ok=True)
        self.protos = tmp / "kubelet-protos"
        write_descriptor_sets(self.protos)
        self.kubelet: subprocess.Popen | None = None
        self.plugin: subprocess.Popen | None = None
        self.port = 0

    @classmethod
    def running(cls, d: RunningDaemon, tmp: Path) -> DevicePluginNode:
        """A node with the kubelet and the plugin started, and the plugin registered."""
        n = cls(d, tmp)
        n.start_kubelet()
        n.start_plugin()
        n.wait_registered()
        return n

    # -- processes -------------------------------------------------------------------------------------
    def start_kubelet(self) -> None:
        log = open(self.tmp / "kubelet.log", "a")  # noqa: SIM115 - the child's
        self.kubelet = subprocess.Popen(
            [sys.executable, str(CLIENTS / "kubelet_devices.py"), str(self.protos), str(self.dir),
             str(self.pod_resources), str(self.state), str(self.seed)],
            stdout=subprocess.PIPE, stderr=log, text=True, cwd=REPO,
        )  # fmt: skip
        assert self.kubelet.stdout is not None
        line = self.kubelet.stdout.readline()
        assert line, (self.tmp / "kubelet.log").read_text()
        self.port = json.loads(line)["control"]

    def stop_kubelet(self, sig: int = signal.SIGKILL) -> None:
        assert self.kubelet is not None
        self.kubelet.send_signal(sig)
        self.kubelet.wait(20)

    def start_plugin(self, *extra: str, umask: int = -1) -> None:
        argv = [*self.gpuslice, "device-plugin", "--node-name", NODE, "--kubeconfig", str(self.kubeconfig),
                "--socket", str(self.d.socket), "--plugin-dir", str(self.dir), "--pod-resources",
                str(self.pod_resources), "--reconcile", "0.3", *self.plugin_args, *extra]  # fmt: skip
        log = open(self.tmp / "plugin.log", "a")  # noqa: SIM115 - the child's
        self.plugin = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, umask=umask)

    def stop_plugin(self, sig: int = signal.SIGTERM) -> None:
        assert self.plugin is not None
        self.plugin.send_signal(sig)
        self.plugin.wait(20)

    def log(self) -> str:
        return "".join((self.tmp / n).read_text() for n in ("plugin.log", "kubelet.log") if (self.tmp / n).exists())

    def close(self) -> None:
        for p in (self.plugin, self.kubelet):
            if p and p.poll() is None:
                p.kill()
                p.wait(10)
        self.api.stop()

    # -- the kubelet's control API -------------------------------------------------------------------
    def _call(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", data=data, timeout=120) as r:
            return json.loads(r.read())

    def state_of(self) -> dict[str, Any]:
        return self._call("/state")

    def wait_registered(self, seconds: float = 30, since: dict[str, int] | None = None) -> dict[str, Any]:
        """The kubelet's view once all three resources are registered and listed (after `since`'s updates)."""
        deadline = time.monotonic() + seconds
        while True:
            s = self.state_of()
            if all(s["updates"].get(r, 0) > (since or {}).get(r, 0) for r in RESOURCES):
                return s
            assert time.monotonic() < deadline, (s, self.log())
            assert self.plugin is None or self.plugin.poll() is None, self.log()
            time.sleep(0.05)

    def admit(self, p: dict[str, Any]) -> dict[str, Any]:
        """The pod as kube-scheduler binds it (in the API, Pending), then the kubelet admits it and
        writes its phase back."""
        self.api.put_pod(p)
        out = self._call("/admit", p)
        self.api.set_phase(p["metadata"]["uid"], "Running" if out["admitted"] else "Failed")
        return out

    def delete(self, p: dict[str, Any]) -> None:
        self.api.pods.pop(p["metadata"]["uid"], None)
        self._call("/delete", {"uid": p["metadata"]["uid"]})

    def options(self, p: dict[str, Any], container: str = "c0") -> dict[str, Any]:
        uid = p["metadata"]["uid"]
        return self._call(f"/options?uid={uid}&container={container}")

    def published(self) -> dict[str, Any] | None:
        """The per-GPU state the plugin last published on its Node, read back."""
        text = (self.api.nodes[NODE]["metadata"].get("annotations") or {}).get("gpuslice.io/gpus")
        return None if text is None else json.loads(text)

    def allocations(self) -> dict[str, Any]:
        """The daemon's device plugin allocations, by key."""
        return {s.container_id: s for s in self.d.client().list() if s.owner_kind == pb.DEVICES}

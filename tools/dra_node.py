"""The DRA side of a node, for the tests and the bench: the kubelet plugin run
as `gpuslice kubelet-plugin` against a daemon and a stand-in API server
(tools/api_server.py); and claims as kube-scheduler allocates them.  How the
kubelet drives it is the caller's: the bench calls the plugin's gRPC with the
package's own protos, the tests through a stand-in kubelet built from the
official ones (tests/harness/dra.py)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from gpuslice.cli.sim_daemon import RunningDaemon
from tools.api_server import ApiServer

NODE = "node-a"


def listening(path: Path) -> bool:
    """A socket that accepts: a file left by a killed plugin does not."""
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


class PluginNode:
    """A daemon with its node spec, the plugin (`gpuslice kubelet-plugin`, its own
    process) writing claims' specs to `claim_specs`, and a stand-in API server."""

    def __init__(self, d: RunningDaemon, spec: Path, tmp: Path, claim_specs: Path,
                 gpuslice: list[str] | None = None) -> None:  # fmt: skip
        # how to run `gpuslice`: this checkout's, or e.g. the plugin's container image
        self.gpuslice = gpuslice or [sys.executable, "-m", "gpuslice.cli"]
        self.plugin_args: list[str] = []  # more options for `gpuslice kubelet-plugin`
        self.d = d
        self.tmp = tmp
        self.spec = spec
        self.api = ApiServer()
        self.kubeconfig = self.api.kubeconfig(tmp / "kubeconfig")
        self.plugin_dir = tmp / "plugins" / "gpuslice.io"
        self.registry = tmp / "plugins_registry"
        self.claim_specs = claim_specs
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> Path:
        return self.plugin_dir / "dra.sock"

    def start_plugin(self) -> None:
        argv = [*self.gpuslice, "kubelet-plugin", "--node-name", NODE, "--kubeconfig",
                str(self.kubeconfig), "--socket", str(self.d.socket), "--plugin-dir", str(self.plugin_dir),
                "--registry-dir", str(self.registry), "--cdi-dir", str(self.claim_specs),
                "--cdi-spec", str(self.spec), *self.plugin_args]  # fmt: skip
        log = open(self.tmp / "plugin.log", "a")  # noqa: SIM115 - the child's
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not (listening(self.registry / "gpuslice.io-reg.sock") and listening(self.endpoint)):
            assert self.proc.poll() is None, self.log()
            assert time.monotonic() < deadline, self.log()
            time.sleep(0.05)

    def stop_plugin(self, sig: int = signal.SIGTERM) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.proc.wait(20)

    def log(self) -> str:
        return (self.tmp / "plugin.log").read_text()

    def slices(self) -> dict[str, object]:
        return {s.container_id: s for s in self.d.client().list()}

    def close(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.stop_plugin()
        self.api.stop()


def allocated(name: str, *devices: tuple[str, str | None, str | None], config: list | None = None) -> dict:
    """A ResourceClaim as kube-scheduler leaves it: one request `gpu`, one
    result per (device, memory, cores), each with its share's ID."""
    capacity = {k: v for k, v in (("memory", devices[0][1]), ("cores", devices[0][2])) if v}
    results = []
    for device, memory, cores in devices:
        consumed = {k: v for k, v in (("memory", memory), ("cores", cores)) if v}
        share = {"consumedCapacity": consumed, "shareID": str(uuid.uuid4())} if consumed else {}
        results.append({"request": "gpu", "driver": "gpuslice.io", "pool": NODE, "device": device, **share})
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ml", "uid": str(uuid.uuid4())},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpuslice.io", "count": len(devices),
            **({"capacity": {"requests": capacity}} if capacity else {})}}]}},
        "status": {"allocation": {
            "devices": {"results": results, **({"config": config} if config else {})},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]},
        }},
    }  # fmt: skip

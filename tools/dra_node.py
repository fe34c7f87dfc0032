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
from dataclasses import dataclass
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

    def __init__(
        self, d: RunningDaemon, spec: Path, tmp: Path, claim_specs: Path, gpuslice: list[str] | None = None
    ) -> None:
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
        self.umask = -1  # the plugin's umask; -1: this process's

    @property
    def endpoint(self) -> Path:
        return self.plugin_dir / "dra.sock"

    def start_plugin(self) -> None:
        argv = [*self.gpuslice, "kubelet-plugin", "--node-name", NODE, "--kubeconfig",
                str(self.kubeconfig), "--socket", str(self.d.socket), "--plugin-dir", str(self.plugin_dir),
                "--registry-dir", str(self.registry), "--cdi-dir", str(self.claim_specs),
                "--cdi-spec", str(self.spec), *self.plugin_args]  # fmt: skip
        log = open(self.tmp / "plugin.log", "a")  # noqa: SIM115 - the child's
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, umask=self.umask)
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


@dataclass(frozen=True)
class Result:
    """One allocation result as the allocator writes it for a shared device:
    both capacities consumed (a request's own, else the requestPolicy
    defaults: cores 0) and a share ID, always."""

    device: str
    memory: str
    cores: str = "0"
    request: str = "gpu"  # "<request>" or "<request>/<subrequest>" (firstAvailable)
    admin: bool = False


def _results(devices: tuple) -> list[Result]:
    """Results from Result records or (device, memory, cores) tuples (cores None: the default, 0)."""
    return [d if isinstance(d, Result) else Result(d[0], d[1], d[2] or "0") for d in devices]


def _requests(results: list[Result]) -> list[dict]:
    """The claim's requests that these results answer, in order of first use."""
    by_name: dict[str, list[Result]] = {}
    for r in results:
        by_name.setdefault(r.request, []).append(r)
    requests: dict[str, dict] = {}
    for full, rs in by_name.items():
        base, _, sub = full.partition("/")
        exact = {"deviceClassName": "gpuslice.io", "count": len(rs),
                 "capacity": {"requests": {"memory": rs[0].memory, "cores": rs[0].cores}},
                 **({"adminAccess": True} if rs[0].admin else {})}  # fmt: skip
        if sub:  # a firstAvailable list: this subrequest is the one the allocator took
            entry = requests.setdefault(base, {"name": base, "firstAvailable": []})
            entry["firstAvailable"].append({"name": sub, **exact})
        else:
            requests[base] = {"name": base, "exactly": exact}
    return list(requests.values())


def allocated(name: str, *devices: Result | tuple[str, str, str | None], config: list | None = None) -> dict:
    """A ResourceClaim as kube-scheduler leaves it: one result per device, each
    with its request, both consumed capacities and its share's ID."""
    results = _results(devices)
    written = [
        {"request": r.request, "driver": "gpuslice.io", "pool": NODE, "device": r.device,
         "consumedCapacity": {"memory": r.memory, "cores": r.cores}, "shareID": str(uuid.uuid4()),
         **({"adminAccess": True} if r.admin else {})}
        for r in results
    ]  # fmt: skip
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ml", "uid": str(uuid.uuid4())},
        "spec": {"devices": {"requests": _requests(results)}},
        "status": {"allocation": {
            "devices": {"results": written, **({"config": config} if config else {})},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]},
        }},
    }  # fmt: skip

"""The device plugin's and the scheduler extender's configuration: one type
each, with its defaults (the command line reads them from here)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuslice import constants, request

DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
# the extender's choice among nodes, in the words of a container's among GPUs: the fullest that fits, or the emptiest
POLICIES = tuple(p.value for p in request.GpuPolicy)
# a pod's own choice among nodes, over the extender's (the webhook writes it for HAMi's node-scheduler-policy);
# not under gpuslice.io/, whose pod annotations the runtime copies into the containers as requests
NODE_POLICY = "scheduler.gpuslice.io/node-policy"


@dataclass(frozen=True)
class Options:
    node: str
    daemon_socket: str = constants.CONTROL_SOCKET
    kubeconfig: str | None = None
    plugin_dir: Path = DEVICE_PLUGIN_DIR
    pod_resources: Path = POD_RESOURCES_SOCKET
    reconcile_s: float = 2.0
    use_api: bool = True  # read pending pods (exact one-GPU admission, admission.py); publish per-GPU state
    sysfs: Path = Path("/sys")  # where each GPU's NUMA node is read (its whole-GPU unit's topology)


@dataclass(frozen=True)
class ExtenderOptions:
    listen: str = "127.0.0.1:8790"  # HOST:PORT for kube-scheduler's calls (beside it in its pod: the loopback)
    policy: str = "binpack"  # binpack or spread

"""The DRA kubelet plugin's configuration: one type, with its defaults (the
command line reads them from here)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuslice import constants
from gpuslice.cdi.registry import DYNAMIC_DIR
from gpuslice.dra.resource_slice import DRIVER

PLUGIN_DIR = Path("/var/lib/kubelet/plugins") / DRIVER
REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")


@dataclass(frozen=True)
class Options:
    node: str
    daemon_socket: str = constants.CONTROL_SOCKET
    kubeconfig: str | None = None
    plugin_dir: Path = PLUGIN_DIR
    registry_dir: Path = REGISTRY_DIR
    cdi_dir: Path = DYNAMIC_DIR
    base_spec: Path | None = None  # the node's gpuslice.io/gpu spec; default: the one CDI resolves
    republish_s: float = 30.0
    sysfs: Path = Path("/sys")  # where the standard pcieRoot attribute is read

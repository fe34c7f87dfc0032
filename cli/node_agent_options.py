"""The node agent's configuration: one type, with its defaults (the command
line and the chart read them from here; the daemon's own from its Config)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuslice import constants
from gpuslice.allocator.config import Config
from gpuslice.cdi.registry import DYNAMIC_DIR
from gpuslice.host_root import HostRoot

RUNTIMES = ("containerd", "crio", "none")  # none: the runtime is left as it is
RESTARTS = ("systemd", "none")  # how the runtime loads its new configuration
RUN_DIR = Path(constants.CONTROL_SOCKET).parent


@dataclass(frozen=True)
class Options:
    host_root: Path = Path("/host")  # where the host's / is mounted in this container
    host_dir: str = "/opt/gpuslice"  # where the node's parts go, a host path
    driver_root: str = "/"  # where the driver is installed, a host path (/run/nvidia/driver: a driver container)
    runtime: str = "containerd"  # one of RUNTIMES
    runtime_restart: str = "systemd"  # one of RESTARTS
    runtime_config: str = ""  # containerd's config.toml, a host path, where not /etc/containerd/config.toml
    runtime_version: tuple[int, int] | None = None  # else asked of the host's binary
    # the daemon's sockets and slice files, the host's, mounted at the same path; the
    # runtime shim looks in /run/gpuslice (the hook is told by the spec)
    run_dir: Path = RUN_DIR
    state_dir: Path = Path(constants.STATE_DIR)  # the host's /var/lib/gpuslice, mounted
    cdi_dir: Path = DYNAMIC_DIR  # the host's, mounted
    metrics_port: int = Config.metrics_port  # the daemon's defaults
    compute_period: float = Config.compute_period
    driver_poll: float = 10.0  # seconds between looks at the driver's files

    def here(self, host_path: str | Path, what: str = "path") -> Path:
        """A host path as this container reaches it (normalised: a `..` never leads out of /host)."""
        return HostRoot(self.host_root).here(host_path, what)

"""A simulated host for the node agent: a directory standing for a node's `/`
with a containerd config (1.6, 1.7 or 2.x, as the CRI harness writes a node's),
that containerd's binary where a node keeps it, and the simulated driver
installed as NVIDIA's installer lays out the real one: versioned library files,
the .so.1 links (one relative, one absolute, as distributions ship both), and
what the libraries need beside them."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.harness.containerd import containerd_bin, node_config

DRIVER_VERSION = "580.95.05"  # the version the files are named after (the simulator reports its own)
LIBDIR = "usr/lib/x86_64-linux-gnu"


@dataclass
class FakeHost:
    root: Path
    sim_config: Path
    sim_state: Path
    version: str  # containerd's: "1.6", "1.7", "2.x"

    @property
    def containerd_config(self) -> Path:
        return self.root / "etc/containerd/config.toml"

    def env(self) -> dict[str, str]:
        """What the simulated driver reads (a real one needs none)."""
        return {"GPUSLICE_SIM_CONFIG": str(self.sim_config), "GPUSLICE_SIM_STATE_DIR": str(self.sim_state)}

    def snapshot(self) -> dict[str, tuple[str, bytes | str | int]]:
        """Every file (bytes, mode), link (target) and directory under the root."""
        found: dict[str, tuple[str, bytes | str | int]] = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            for name in dirnames + filenames:
                p = Path(dirpath) / name
                rel = str(p.relative_to(self.root))
                if p.is_symlink():
                    found[rel] = ("link", os.readlink(p))
                elif p.is_dir():
                    found[rel] = ("dir", p.stat().st_mode & 0o7777)
                else:
                    found[rel] = ("file", p.read_bytes() + oct(p.stat().st_mode & 0o7777).encode())
        return found


def _sim_libs() -> Path:
    import gpuslice_sim

    return gpuslice_sim.lib_dir()


def build(root: Path, work: Path, version: str, gpus: list[dict] | None = None) -> FakeHost:
    """A host root at `root` with containerd `version`'s config and binary and
    the simulated driver; the simulator's machine and state under `work`."""
    lib = root / LIBDIR
    lib.mkdir(parents=True)
    sim = _sim_libs()
    shutil.copy2(sim / "libcuda.so.1", lib / f"libcuda.so.{DRIVER_VERSION}")
    (lib / "libcuda.so.1").symlink_to(f"libcuda.so.{DRIVER_VERSION}")
    shutil.copy2(sim / "libnvidia-ml.so.1", lib / f"libnvidia-ml.so.{DRIVER_VERSION}")
    (lib / "libnvidia-ml.so.1").symlink_to(f"/{LIBDIR}/libnvidia-ml.so.{DRIVER_VERSION}")  # absolute: the host's
    # the PTX JIT compiler's library, as a driver installs it (the simulator's stand-in)
    shutil.copy2(sim / "libnvidia-ptxjitcompiler.so.1", lib / f"libnvidia-ptxjitcompiler.so.{DRIVER_VERSION}")
    (lib / "libnvidia-ptxjitcompiler.so.1").symlink_to(f"libnvidia-ptxjitcompiler.so.{DRIVER_VERSION}")
    shutil.copy2(Path("/usr/lib/x86_64-linux-gnu/libyaml-0.so.2").resolve(), lib / "libyaml-0.so.2")
    bindir = root / "usr/bin"
    bindir.mkdir(parents=True)
    shutil.copy2(containerd_bin(version) / "containerd", bindir / "containerd")
    ctd_version = (2, 0) if version == "2.x" else tuple(int(x) for x in version.split("."))
    etc = root / "etc/containerd"
    etc.mkdir(parents=True)
    (etc / "config.toml").write_text(node_config(root / "var/lib/containerd", root / "run/containerd", ctd_version))
    (root / "etc/hostname").write_text("fake-node\n")
    work.mkdir(parents=True, exist_ok=True)
    sim_config = work / "sim.yaml"
    sim_config.write_text(yaml.safe_dump({"gpus": gpus or [{"memory": "16Gi"}]}))
    return FakeHost(root, sim_config, work / "sim-state", version)

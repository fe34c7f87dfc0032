"""Generate the gpuslice CDI spec from the GPUs (NVML) and the driver's files.

Inside a container the interposer stands where the loader looks first
(LD_LIBRARY_PATH), the real driver libraries sit at a private path behind
it, the slice socket's directory is mounted, and the hook binds the container
to its slice at createRuntime and releases it at poststop."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpuslice.allocator.inventory import Inventory
from gpuslice.cdi.spec import Device, Edits, Hook, Mount, Spec

from gpuslice.paths import native_dir

WRAP_DIR = "/usr/lib/gpuslice/wrap"
DRIVER_DIR = "/usr/lib/gpuslice/driver"
SLICE_DIR = "/run/gpuslice/slice"
SIM_STATE = "/run/gpuslice/sim"
SIM_CONFIG = "/etc/gpuslice/sim.yaml"
LIB_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "lib64", "usr/lib", "lib")
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
# libraries every container image brings itself
BASE_LIBS = re.compile(r"^(libc|libm|libdl|libpthread|librt|ld-linux[-\w]*)\.so")


class DriverFilesError(LookupError):
    pass


@dataclass(frozen=True)
class Options:
    driver: str = "nvidia"  # or "sim"
    driver_root: Path = Path("/")
    hook: str = ""  # path of gpuslice-hook on the host
    daemon_socket: str = "/run/gpuslice/gpuslice.sock"
    slice_dir: str = "/run/gpuslice/slice"  # host directory of the slice socket
    sim_config: str | None = None
    sim_state_dir: str | None = None


def _find_lib(root: Path, stem: str, version: str) -> Path:
    for d in LIB_DIRS:
        for name in (f"{stem}.so.{version}", f"{stem}.so.1"):
            p = root / d / name
            if p.exists():
                return p.resolve()
    raise DriverFilesError(f"{stem}.so.{version} not found under {root} ({', '.join(LIB_DIRS)})")


def _extra_deps(lib: Path) -> list[Path]:
    """Shared libraries lib needs beyond what every image has (e.g. libyaml)."""
    out = subprocess.run(["ldd", str(lib)], capture_output=True, text=True).stdout
    deps = []
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) => (/\S+)", line)
        if m and not BASE_LIBS.match(m.group(1)):
            deps.append(Path(m.group(2)).resolve())
    return deps


def _driver_files(inv: Inventory, opts: Options) -> tuple[list[Mount], list[str]]:
    """Real driver libraries (mounted at the private path) and control nodes."""
    if opts.driver == "sim":
        sim = native_dir() / "sim"
        libs = [sim / "libcuda.so.1", sim / "libnvidia-ml.so.1"]
        mounts = [Mount(str(p), f"{DRIVER_DIR}/{p.name}") for p in libs]
        mounts += [Mount(str(d), f"{DRIVER_DIR}/{d.name}") for d in _extra_deps(libs[0])]
        return mounts, []
    root = opts.driver_root
    mounts = [
        Mount(str(_find_lib(root, "libcuda", inv.driver_version)), f"{DRIVER_DIR}/libcuda.so.1"),
        Mount(str(_find_lib(root, "libnvidia-ml", inv.driver_version)), f"{DRIVER_DIR}/libnvidia-ml.so.1"),
    ]
    smi = shutil.which("nvidia-smi", path=f"{root / 'usr/bin'}:{root / 'usr/sbin'}")
    if smi:
        mounts.append(Mount(smi, "/usr/bin/nvidia-smi"))
    nodes = [f"/dev/{n}" for n in CONTROL_NODES if (root / "dev" / n).exists()]
    return mounts, nodes


def _common_edits(inv: Inventory, opts: Options) -> Edits:
    mounts, nodes = _driver_files(inv, opts)
    wrap = native_dir() / "wrap"
    mounts += [Mount(str(wrap / n), f"{WRAP_DIR}/{n}") for n in ("libcuda.so.1", "libnvidia-ml.so.1")]
    # the directory, never the socket: a restarted daemon's new socket is seen
    mounts.append(Mount(opts.slice_dir, SLICE_DIR, ["rw", "nosuid", "nodev", "bind"]))
    env = [
        f"LD_LIBRARY_PATH={WRAP_DIR}:{DRIVER_DIR}",
        f"GPUSLICE_REAL_LIBCUDA={DRIVER_DIR}/libcuda.so.1",
        f"GPUSLICE_REAL_LIBNVML={DRIVER_DIR}/libnvidia-ml.so.1",
        f"GPUSLICE_SLICE_SOCKET={SLICE_DIR}/slice.sock",
    ]
    if opts.driver == "sim":
        if opts.sim_state_dir:
            mounts.append(Mount(opts.sim_state_dir, SIM_STATE, ["rw", "nosuid", "nodev", "bind"]))
            env.append(f"GPUSLICE_SIM_STATE_DIR={SIM_STATE}")
        if opts.sim_config:
            mounts.append(Mount(opts.sim_config, SIM_CONFIG))
            env.append(f"GPUSLICE_SIM_CONFIG={SIM_CONFIG}")
    hook_env = [f"GPUSLICE_SOCKET={opts.daemon_socket}"]
    hooks = [
        Hook("createRuntime", opts.hook, ["gpuslice-hook", "createRuntime"], hook_env),
        Hook("poststop", opts.hook, ["gpuslice-hook", "poststop"], hook_env),
        # the loader cache as well as LD_LIBRARY_PATH, for programs that drop the latter
        Hook("createContainer", opts.hook, ["gpuslice-hook", "update-ldcache"], hook_env),
    ]
    return Edits(env=env, device_nodes=nodes, mounts=mounts, hooks=hooks)


def _device_edits(index: int, uuid: str, opts: Options) -> Edits:
    # the hook reads these to pin the slice to the GPUs CDI injected
    nodes = [f"/dev/nvidia{index}"] if opts.driver != "sim" else []
    return Edits(env=[f"GPUSLICE_DEVICE_{index}={uuid}"], device_nodes=nodes)


def generate(inv: Inventory, opts: Options) -> dict:
    if not opts.hook:
        raise DriverFilesError("the gpuslice-hook executable was not found (pass --hook)")
    devices = []
    for g in inv.gpus:
        edits = _device_edits(g.index, g.uuid, opts)
        devices += [Device(str(g.index), edits), Device(g.uuid, edits)]
    every = Edits(
        env=[e for g in inv.gpus for e in _device_edits(g.index, g.uuid, opts).env],
        device_nodes=[n for g in inv.gpus for n in _device_edits(g.index, g.uuid, opts).device_nodes],
    )
    devices.append(Device("all", every))
    return Spec(devices=devices, edits=_common_edits(inv, opts)).to_dict()

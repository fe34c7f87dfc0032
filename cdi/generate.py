"""Compose the gpuslice CDI spec from the GPUs (NVML) and the driver's files.

Inside a container the interposer stands where the loader looks first (the
hook puts its directory at the head of the container's loader cache), the
real driver libraries sit at a private path behind it, the slice socket's
directory is mounted, and the hook binds the container to its slice at
createRuntime and releases it at poststop.  The spec sets no LD_LIBRARY_PATH:
a runtime applying a CDI spec's env replaces the container's own value, and
images and pods set it for their own libraries."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuslice import constants
from gpuslice.cdi import driver_files
from gpuslice.cdi.registry import DYNAMIC_DIR
from gpuslice.cdi.spec import ContainerEdits, Device, DeviceNode, Hook, Mount, Spec
from gpuslice.host_root import HostRoot
from gpuslice.inventory import Inventory
from gpuslice.paths import native_dir

WRAP_DIR = constants.CONTAINER_WRAP_DIR
DRIVER_DIR = constants.CONTAINER_DRIVER_DIR
SLICE_DIR = constants.SLICE_SOCKET_DIR
SIM_STATE = "/run/gpuslice/sim"
SIM_CONFIG = "/etc/gpuslice/sim.yaml"
RW = ("rw", "nosuid", "nodev", "bind")
INTERPOSER = ("libcuda.so.1", "libnvidia-ml.so.1")  # the files of the interposer's directory


SPEC_NAME = "gpuslice.json"
OUTPUT = DYNAMIC_DIR / SPEC_NAME  # where `gpuslice cdi generate` writes the spec


@dataclass(frozen=True)
class Options:
    driver: str = "nvidia"  # or "sim"
    driver_root: Path = Path("/")
    hook: str = ""  # path of gpuslice-hook on the host
    daemon_socket: str = constants.CONTROL_SOCKET
    slice_dir: str = constants.SLICE_SOCKET_DIR  # host directory of the slice socket
    sim_config: str | None = None
    sim_state_dir: str | None = None
    # where the host's / is as this process sees it: the node agent finds the
    # driver under /host, and the spec names the host's paths, without /host
    host_root: Path = Path("/")
    interposer_dir: str = ""  # the interposer's directory on the host (default: the one built with gpuslice)

    @property
    def driver_here(self) -> Path:
        """The driver root (a host path) as this process reaches it."""
        return HostRoot(self.host_root).here(self.driver_root, "driver root")

    def on_host(self, path: Path) -> str:
        """A path this process found, as the host (the runtime reading the spec) names it."""
        return HostRoot(self.host_root).on_host(path)


def _driver_mounts(files: driver_files.DriverFiles, opts: Options) -> list[Mount]:
    mounts = [
        Mount(opts.on_host(files.libcuda), f"{DRIVER_DIR}/libcuda.so.1"),
        Mount(opts.on_host(files.libnvml), f"{DRIVER_DIR}/libnvidia-ml.so.1"),
    ]
    mounts += [Mount(opts.on_host(p), f"{DRIVER_DIR}/{name}") for name, p in files.compute_libs]
    mounts += [Mount(opts.on_host(p), f"{DRIVER_DIR}/{p.name}") for p in files.extra_libs]
    if files.nvidia_smi:
        mounts.append(Mount(opts.on_host(files.nvidia_smi), "/usr/bin/nvidia-smi"))
    return mounts


def _common_edits(files: driver_files.DriverFiles, opts: Options) -> ContainerEdits:
    wrap = opts.interposer_dir or str(native_dir() / "wrap")
    mounts = _driver_mounts(files, opts)
    mounts += [Mount(f"{wrap}/{n}", f"{WRAP_DIR}/{n}") for n in INTERPOSER]
    # the directory, never the socket: a restarted daemon's new socket is seen
    mounts.append(Mount(opts.slice_dir, SLICE_DIR, RW))
    env = [
        f"{constants.ENV_REAL_LIBCUDA}={DRIVER_DIR}/libcuda.so.1",
        f"{constants.ENV_REAL_LIBNVML}={DRIVER_DIR}/libnvidia-ml.so.1",
        f"{constants.ENV_SLICE_SOCKET}={SLICE_DIR}/{constants.SLICE_SOCKET_NAME}",
    ]
    if opts.driver == "sim":
        if opts.sim_state_dir:
            mounts.append(Mount(opts.sim_state_dir, SIM_STATE, RW))
            env.append(f"GPUSLICE_SIM_STATE_DIR={SIM_STATE}")
        if opts.sim_config:
            mounts.append(Mount(opts.sim_config, SIM_CONFIG))
            env.append(f"GPUSLICE_SIM_CONFIG={SIM_CONFIG}")
    hook_env = (f"{constants.ENV_SOCKET}={opts.daemon_socket}",)
    hooks = (
        Hook("createRuntime", opts.hook, ("gpuslice-hook", "createRuntime"), hook_env),
        Hook("poststop", opts.hook, ("gpuslice-hook", "poststop"), hook_env),
        # the loader cache, where the container's programs find the interposer
        Hook("createContainer", opts.hook, ("gpuslice-hook", "update-ldcache"), hook_env),
    )
    nodes = tuple(DeviceNode(p) for p in files.control_nodes)
    return ContainerEdits(env=tuple(env), device_nodes=nodes, mounts=tuple(mounts), hooks=hooks)


def _device_edits(indices_uuids: list[tuple[int, str]], files: driver_files.DriverFiles) -> ContainerEdits:
    # the hook reads the env entries to pin the slice to the GPUs CDI injected
    env = tuple(f"{constants.CDI_DEVICE_ENV_PREFIX}{i}={uuid}" for i, uuid in indices_uuids)
    # the nodes the host has: a runtime refuses a container whose device node is missing
    nodes = tuple(DeviceNode(f"/dev/nvidia{i}") for i, _ in indices_uuids if i in files.gpu_nodes)
    return ContainerEdits(env=env, device_nodes=nodes)


def discover(inv: Inventory, opts: Options) -> driver_files.DriverFiles:
    if opts.driver == "sim":
        return driver_files.simulated()
    return driver_files.nvidia(opts.driver_here, inv.driver_version)


def compose(inv: Inventory, files: driver_files.DriverFiles, opts: Options) -> Spec:
    """The node spec: devices 0, 1, ..., GPU-<uuid> and all."""
    if not opts.hook:
        raise driver_files.DriverFilesError("the gpuslice-hook executable was not found (pass --hook)")
    devices: list[Device] = []
    for g in inv.gpus:
        edits = _device_edits([(g.index, g.uuid)], files)
        devices += [Device(str(g.index), edits), Device(g.uuid, edits)]
    devices.append(Device("all", _device_edits([(g.index, g.uuid) for g in inv.gpus], files)))
    return Spec(kind=constants.CDI_KIND, devices=tuple(devices), edits=_common_edits(files, opts))


def generate(inv: Inventory, opts: Options) -> Spec:
    return compose(inv, discover(inv, opts), opts)

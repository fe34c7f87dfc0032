"""`gpuslice selftest`, the node: the driver and its GPUs, the CDI spec against
the driver's files, the daemon, the runtimes `gpuslice install` configured,
and on a Kubernetes node the kubelet's GPU resources.
Also the layout a container gets from the spec, which the slice checks use."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pynvml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gpuslice import constants, errors, inventory, simulator
from gpuslice.allocator.config import Config
from gpuslice.cdi import driver_files
from gpuslice.cdi import spec as cdi_spec
from gpuslice.cdi.registry import Registry
from gpuslice.cli import container_view, install
from gpuslice.cli.host_files import HostFiles
from gpuslice.cli.selftest_report import Check, failed
from gpuslice.client import AllocatorClient
from gpuslice.device_plugin import units
from gpuslice.device_plugin.node_view import PodResources
from gpuslice.device_plugin.options import POD_RESOURCES_SOCKET
from gpuslice.units import format_bytes

NVIDIA_GPU = "nvidia.com/gpu"


@dataclass(frozen=True)
class Layout:
    """What a container of this node gets from the CDI spec, as host paths: its
    environment (the interposer first on the library path, the driver's
    libraries behind it, the slice socket) and each GPU device's own."""

    env: dict[str, str]
    device_env: dict[int, dict[str, str]] = field(default_factory=dict)
    driver_libcuda: Path = Path()  # the driver's libcuda where the container has it, for runs without the interposer
    view: container_view.View | None = None  # made in each slice's mount namespace: the host's driver hidden


def driver(cfg: Config) -> tuple[list[Check], inventory.Inventory | None]:
    """NVML as the daemon reads it (the driver's, or the simulator the config names)."""
    if cfg.nvml == "sim":
        try:
            simulator.require()
        except simulator.SimulatorMissing as e:
            return [failed("driver", "NVML answers", str(e))], None
        import gpuslice_sim as sim

        os.environ.update(sim.environment(config=cfg.sim_config, state_dir=cfg.sim_state_dir))
        sim.activate()
    try:
        inv = inventory.read()
        pynvml.nvmlInit()  # held for the run: the share checks read NVML too
    except (inventory.NoDriver, pynvml.NVMLError) as e:
        return [failed("driver", "NVML answers", str(e))], None
    cuda = f"{inv.cuda_version // 1000}.{inv.cuda_version % 1000 // 10}"
    nvml = pynvml.nvmlSystemGetNVMLVersion()
    nvml = nvml.decode() if isinstance(nvml, bytes) else nvml
    gpus = "; ".join(f"{g.index}: {g.name}, {format_bytes(g.memory_total)}" for g in inv.gpus) or "none"
    return [
        Check("driver", "NVML answers", f"driver {inv.driver_version}, NVML {nvml}, CUDA {cuda}", True),
        Check("GPUs", "at least one", gpus, bool(inv.gpus)),
    ], inv


def daemon(cfg: Config, inv: inventory.Inventory) -> Check:
    expected = f"serving on {cfg.socket}, the same GPUs as NVML"
    try:
        with grpc.insecure_channel(f"unix:{cfg.socket}") as ch:
            status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5).status
        with AllocatorClient(cfg.socket, timeout=5) as client:
            served = [g.uuid for g in client.inventory().gpus]
    except grpc.RpcError as e:
        return failed("daemon", expected, f"cannot reach it: {e.details()}")
    serving = status == health_pb2.HealthCheckResponse.SERVING
    same = sorted(served) == sorted(g.uuid for g in inv.gpus)
    observed = f"{health_pb2.HealthCheckResponse.ServingStatus.Name(status)}, {len(served)} GPUs"
    return Check("daemon", expected, observed + ("" if same else " (not NVML's)"), serving and same)


def _spec(spec_file: Path | None) -> tuple[cdi_spec.Spec, Path]:
    return Registry().node(spec_file)


def view_links(root: Path, mounts: tuple[cdi_spec.Mount, ...]) -> None:
    """The spec's mounts as a tree of symlinks under root: root/CONTAINER_PATH
    leads to the host file or directory mounted there, so a library path of
    the container's, rebased on root, finds what the container would (on the
    host; in a slice's namespace the view is made of the mounts themselves,
    container_view.enter)."""
    for m in mounts:
        link = root / m.container_path.lstrip("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(m.host_path)


def in_view(root: Path, value: str) -> str:
    """A path of the container's environment, rebased on the view where the
    view has it (the loader and the interposer then open the mounted files)."""
    if not value.startswith("/"):
        return value
    rebased = root / value.lstrip("/")
    known = rebased if rebased.is_symlink() or rebased.exists() else rebased.parent
    return str(rebased) if known.is_symlink() or known.exists() else value


# where the hook's update-ldcache has a container's loader look, after LD_LIBRARY_PATH
LOADER_CACHE_DIRS = (constants.CONTAINER_WRAP_DIR, constants.CONTAINER_DRIVER_DIR)


def _view_env(root: Path, env: tuple[str, ...], cache: tuple[str, ...] = ()) -> dict[str, str]:
    """The environment, rebased on the view. `cache`: the directories the
    container's loader cache adds behind its library path, which a probe on
    the host can only be given on its library path."""
    out: dict[str, str] = {}
    for entry in env:
        key, _, value = entry.partition("=")
        parts = value.split(":") if key == "LD_LIBRARY_PATH" else [value]
        out[key] = ":".join(in_view(root, p) for p in parts)
    if cache:
        path = [p for p in out.get("LD_LIBRARY_PATH", "").split(":") if p]
        out["LD_LIBRARY_PATH"] = ":".join([*path, *(in_view(root, d) for d in cache)])
    return out


def cdi(
    inv: inventory.Inventory, spec_file: Path | None, simulated: bool, view: Path
) -> tuple[list[Check], Layout | None]:
    """The spec, checked; and the containers' layout, built as a view under `view`."""
    expected = "valid; a device per GPU (index, UUID) and all"
    try:
        spec, where = _spec(spec_file)
    except cdi_spec.SpecError as e:
        return [failed("CDI spec", expected, str(e).splitlines()[0])], None
    names = {d.name for d in spec.devices}
    missing = sorted(({"all"} | {str(g.index) for g in inv.gpus} | {g.uuid for g in inv.gpus}) - names)
    observed = f"{where}: {len(names)} devices" + (f", missing {missing}" if missing else "")
    checks = [Check("CDI spec", expected, observed, not missing)]
    mounts = spec.edits.mounts
    expected = "its host files exist; its driver library is the driver's"
    try:
        files = driver_files.simulated() if simulated else driver_files.nvidia(Path("/"), inv.driver_version)
    except errors.GpusliceError as e:
        return [*checks, failed("CDI spec matches the driver", expected, str(e))], None
    view_links(view, mounts)
    hide_files, hide_dirs = container_view.host_driver(files, simulated)
    env = _view_env(view, spec.edits.env, LOADER_CACHE_DIRS)
    layout = Layout(
        env,
        {g.index: _view_env(view, spec.device(str(g.index)).edits.env) for g in inv.gpus if str(g.index) in names},
        Path(env.get(constants.ENV_REAL_LIBCUDA, str(files.libcuda))),
        container_view.View(
            view, tuple((m.host_path, m.container_path) for m in mounts), tuple(hide_files), tuple(hide_dirs)
        ),
    )
    absent = [m.host_path for m in mounts if not Path(m.host_path).exists()]
    given = Path(layout.env.get("GPUSLICE_REAL_LIBCUDA", "(none)"))
    same = given.exists() and given.resolve() == files.libcuda.resolve()
    observed = f"{len(mounts) - len(absent)} of {len(mounts)} mounts present; libcuda {given.resolve()}"
    if absent:
        observed += f"; absent: {', '.join(absent)}"
    checks.append(Check("CDI spec matches the driver", expected, observed, same and not absent))
    return checks, layout


def runtimes(root: Path = Path("/")) -> Check:
    """Each runtime `gpuslice install` configured still holds what it wrote."""
    expected = "each configured runtime as installed"
    configured, changed = [], []
    for target in install.TARGETS:
        record = install.record_path(install.Context(root), target)
        if not record.is_file():
            continue
        configured.append(target)
        try:
            edited = HostFiles(record).edited()
        except (OSError, ValueError, KeyError, TypeError) as e:
            changed.append(f"{target} (its record {record} is unreadable: {e})")
            continue
        changed += [f"{target}: {path}" for path in edited]
    if not configured:
        return Check("runtimes", expected, "none configured (runtimes that read CDI specs need none)", None)
    observed = ", ".join(configured) + (f"; changed since: {'; '.join(changed)}" if changed else "")
    return Check("runtimes", expected, observed, not changed)


def kubelet_resources(socket: Path = POD_RESOURCES_SOCKET) -> Check | None:
    """On a Kubernetes node: the kubelet must not also advertise NVIDIA's
    nvidia.com/gpu (its device plugin), which gives the same GPUs to pods that
    gpuslice books nothing for. None where no kubelet answers."""
    if not socket.exists():
        return None
    expected = "no nvidia.com/gpu beside gpuslice (NVIDIA's device plugin off on this node)"
    reader = PodResources(socket, timeout=5)
    try:
        names = reader.allocatable_names()
    except errors.GpusliceError as e:
        return Check("kubelet resources", expected, f"the kubelet did not answer: {e}", None)
    finally:
        reader.close()
    ours = sorted(n for n in names if n.startswith(units.PREFIX))
    if NVIDIA_GPU in names:
        return Check("kubelet resources", expected, f"the kubelet advertises {NVIDIA_GPU}: the same GPUs are given "
                     "twice; turn NVIDIA's device plugin off on gpuslice nodes", False)  # fmt: skip
    return Check("kubelet resources", expected, ", ".join(ours) or "no GPU resource advertised", True)

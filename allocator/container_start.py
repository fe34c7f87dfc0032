"""What the runtime socket's verbs do when a container starts and stops: the
work of the OCI hook (hook/gpuslice_hook.c) and of the runtime shim
(runtime_shim/gpuslice_runtime.c), run here in the daemon so that a container
start pays for one round trip, not an interpreter.

- create (the shim, before the real runtime): a container whose annotations (or
  GPUSLICE_* environment, see gpuslice.request) ask for a slice gets it
  reserved, and the CDI edits of the GPUs placed for it applied to its
  config.json (written atomically).  A container that asks for nothing, or a
  pod's sandbox, is left byte for byte as it was.
- createRuntime (the hook; container created, not started): the container holds
  a slice bound to its init process: reserved by the shim already, or reserved
  here from its annotations and the GPUs CDI injected.
- createRuntime, for a container with DRA claim devices or device plugin
  allocations (GPUSLICE_SHARE_*): the container joins the share group of exactly the
  shares it was given (the kubelet plugin reserved them); containers given the
  same shares share it.
- poststop: the slice is released (a claim's container leaves its claim's slice).
- ldcache-root (the hook's update-ldcache): the container's root, where the hook
  itself writes the loader configuration.

Any failure aborts creation with one line and leaves nothing reserved."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from gpuslice import constants, errors, request
from gpuslice.allocator import oci
from gpuslice.allocator.records import OwnerKind
from gpuslice.allocator.share_groups import ShareEntry
from gpuslice.allocator.slices import SliceManager
from gpuslice.atomic_file import write_text_atomically
from gpuslice.cdi import apply as cdi_apply
from gpuslice.cdi.registry import Found, Registry
from gpuslice.host_root import HostRoot


@dataclass(frozen=True)
class Host:
    """The host's files as the daemon reaches them: at / on the host, under
    /host in the node agent's container. A runtime names bundles and specs by
    their host paths; what the daemon hands back (a container's root) stays one."""

    root: Path = Path("/")
    # kept for the daemon's life: each spec file is parsed and validated once per change
    registry: Registry = field(default_factory=Registry)

    def here(self, path: Path, what: str = "path") -> Path:
        return HostRoot(self.root).here(path, what)


def requested(config: dict, state: oci.State | None = None) -> request.Asked:
    """What the container asks for (its annotations over its GPUSLICE_*
    environment); nothing for a pod's sandbox, which never gets a GPU."""
    notes = oci.annotations_of(config, state)
    if oci.is_sandbox(notes):
        return request.NOTHING
    return request.gather(notes, oci.process_env(config))


def injected_devices(config: dict) -> list[str]:
    """UUIDs of the GPUs CDI injected (their devices' env entries), by index."""
    prefix = constants.CDI_DEVICE_ENV_PREFIX
    found = []
    for entry in oci.process_env(config):
        name, _, value = entry.partition("=")
        if name.startswith(prefix) and name[len(prefix) :].isdigit() and value:
            found.append((int(name[len(prefix) :]), value))
    return [uuid for _, uuid in sorted(found)]


def _with_injected(ours: request.Asked, config: dict) -> request.Asked:
    devices = injected_devices(config)
    if not devices:
        return ours
    pinned = ours.values.get(request.DEVICE)
    if pinned and {d.strip() for d in pinned.split(",")} != set(devices):
        raise request.RequestError(
            f'{ours.sources[request.DEVICE]}: "{pinned}" differs from the GPUs the CDI devices injected '
            f"({','.join(devices)})"
        )
    values = {**ours.values, request.DEVICE: ",".join(devices)}
    values.setdefault(request.GPUS, str(len(devices)))
    sources = {request.DEVICE: "the CDI devices", request.GPUS: "the CDI devices", **ours.sources}
    return request.Asked(values, sources)


def _container_process(cid: str, pid: int) -> None:
    """The state's pid must be a container's process: never pid 1 or the daemon,
    nor a process in the daemon's own mount namespace (a container has its own
    from before createRuntime runs)."""
    if pid <= 1 or pid == os.getpid():
        raise oci.OciError(f"container {cid}: pid {pid} is {'init' if pid == 1 else 'the daemon'}, not a container's")
    try:
        shared = os.stat(f"/proc/{pid}/ns/mnt").st_ino == os.stat("/proc/self/ns/mnt").st_ino
    except FileNotFoundError:
        raise oci.OciError(f"container {cid}: no process with pid {pid}") from None
    if shared:
        raise oci.OciError(f"container {cid}: pid {pid} shares the daemon's mount namespace: not a container's")


_SHARE_ENTRY = re.compile(r"([^/]+)/([^/]+)/([^/]*)")  # <owner UID>/<share>/<the share's membership key>


def shares_of(config: dict) -> list[ShareEntry]:
    """The shares whose CDI devices the container got, if any (of DRA claims,
    of device plugin allocations): one env entry per device,
    "<owner UID>/<share>/<the share's membership key>". The key is what proves
    the device was given, and whose share it is (allocator/membership.py):
    the UID and share alone are public."""
    found = []
    for entry in oci.process_env(config):
        name, _, value = entry.partition("=")
        if name.startswith(constants.ENV_SHARE_PREFIX) and value:
            parsed = _SHARE_ENTRY.fullmatch(value)
            if parsed is None:
                raise oci.OciError(f"{name}={value!r}: not a claim share; accepted <claim UID>/<share>/<key>")
            found.append(ShareEntry(*parsed.groups()))
        elif name == constants.ENV_CLAIM and value:
            # what specs before per-share devices set: the UID alone, which anyone can write
            raise oci.OciError(
                f"{name}={value!r}: a claim is joined only through the share devices the DRA plugin prepares "
                f"({constants.ENV_SHARE_PREFIX}*); a claim prepared by an older plugin must be prepared again"
            )
    return list(dict.fromkeys(found))


def create_runtime(state: oci.State, slices: SliceManager, host: Host) -> None:
    cid = state.id
    if state.pid <= 0:
        raise oci.OciError(f"container {cid}: the OCI state has no pid (createRuntime runs once the container exists)")
    config = oci.read_config(host.here(state.bundle, "bundle"), cid)
    entries = shares_of(config)
    if entries:  # reserved by the DRA or device plugin: the container joins the group of the shares it was given
        shares = slices.typed_shares(entries)
        compute = None
        if any(s.owner.kind is OwnerKind.DEVICES for s in shares):
            compute = request.read_compute(requested(config, state))  # its size is the kubelet's allocation
        _container_process(cid, state.pid)
        slices.join(cid, shares, state.pid, compute, oci.workload_of(oci.annotations_of(config, state)))
        return
    try:
        slices.get(cid)
        reserved_here = False  # the runtime shim reserved it
        _container_process(cid, state.pid)
    except errors.NotFound:
        ours = requested(config, state)
        if not ours:
            return  # the container asks for no GPU
        asked = request.read(_with_injected(ours, config))  # bad values fail here, with the parser's one line
        assert asked is not None
        _container_process(cid, state.pid)
        slices.reserve(cid, asked, owner="hook", workload=oci.workload_of(oci.annotations_of(config, state)))
        reserved_here = True
    try:
        slices.bind(cid, state.pid)
    except BaseException:
        if reserved_here:
            slices.release(cid)
        raise


def poststop(state: oci.State, slices: SliceManager) -> None:
    slices.release(state.id)


def container_root(state: oci.State, host: Host) -> str:
    """The container's root as the host names it (the hook writes there)."""
    return str(oci.root_path(state.bundle, oci.read_config(host.here(state.bundle, "bundle"), state.id), state.id))


def _devices(spec_path: str, uuids: list[str], host: Host) -> list[Found]:
    """The CDI devices of the placed GPUs: from the spec the shim names, else the
    spec directories (with their precedence)."""
    if not spec_path:
        return host.registry.resolve(uuids)
    spec = host.registry.named(host.here(Path(spec_path), "spec"))
    return [Found(spec, spec.device(u), Path(spec_path), 0) for u in uuids]


def prepare(bundle: Path, container_id: str, slices: SliceManager, host: Host, spec_path: str = "") -> bool:
    """Give the container its slice (the shim's create); False when it asks for none."""
    bundle = host.here(bundle, "bundle")
    config = oci.read_config(bundle, container_id)
    asked = request.read(requested(config))  # the one line for bad values, before anything is reserved
    if asked is None:
        return False
    placed = slices.reserve(
        container_id, asked, owner="runtime-shim", workload=oci.workload_of(oci.annotations_of(config))
    )
    try:
        cdi_apply.inject(config, _devices(spec_path, [a.gpu_uuid for a in placed.allocations], host))
        path = bundle / oci.CONFIG_NAME
        write_text_atomically(path, json.dumps(config), os.stat(path).st_mode & 0o777)
    except BaseException:
        slices.release(container_id)
        raise
    return True

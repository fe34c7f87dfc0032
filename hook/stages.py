"""What the OCI hook's stages do, run by the daemon for `gpuslice-hook`
(hook/gpuslice_hook.c) on its runtime socket.

createRuntime (runtime namespace, container created, not started): from the
OCI state and the bundle's config.json, make sure the container holds a slice
bound to its init process: reserved already by the runtime shim, or reserved
here from the annotations and the GPUs CDI injected.  Any failure aborts
creation with one line and leaves nothing reserved.
poststop: releases the slice.
update-ldcache (createContainer): the container's root, where the hook
itself writes the loader configuration (it runs in the runtime's mount
namespace; the daemon may not)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from gpuslice.allocator.slices import NotFound, SliceManager

from gpuslice import request

INJECTED = re.compile(r"^GPUSLICE_DEVICE_(\d+)=(.+)$")


class HookError(Exception):
    pass


def parse_state(payload: bytes) -> dict:
    try:
        state = json.loads(payload)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HookError(f"the OCI state on stdin is not JSON: {e}") from e
    if not isinstance(state, dict) or not isinstance(state.get("id"), str) or not state.get("bundle"):
        raise HookError("the OCI state on stdin has no container id or bundle")
    return state


def bundle_config(state: dict) -> dict:
    path = Path(state["bundle"]) / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise HookError(f"container {state['id']}: cannot read {path}: {e}") from e


def injected_devices(config: dict) -> list[str]:
    """UUIDs of the GPUs CDI injected (their devices' env entries)."""
    found = sorted(
        (int(m.group(1)), m.group(2)) for e in config.get("process", {}).get("env", []) if (m := INJECTED.match(e))
    )
    return [uuid for _, uuid in found]


def requested(config: dict, state: dict) -> dict[str, str] | None:
    annotations = {**config.get("annotations", {}), **(state.get("annotations") or {})}
    ours = {k: v for k, v in annotations.items() if k.startswith(request.PREFIX)}
    devices = injected_devices(config)
    if devices:
        pinned = ours.get(request.DEVICE)
        if pinned and set(pinned.split(",")) != set(devices):
            raise HookError(
                f'annotation {request.DEVICE}: "{pinned}" differs from the GPUs the CDI devices injected '
                f"({','.join(devices)})"
            )
        ours[request.DEVICE] = ",".join(devices)
        ours.setdefault(request.GPUS, str(len(devices)))
    return ours or None


def create_runtime(state: dict, slices: SliceManager) -> None:
    cid, pid = state["id"], int(state.get("pid") or 0)
    if pid <= 0:
        raise HookError(f"container {cid}: the OCI state has no pid (createRuntime runs once the container exists)")
    config = bundle_config(state)
    try:
        slices.get(cid)
        reserved_here = False  # the runtime shim reserved it
    except NotFound:
        ours = requested(config, state)
        if ours is None:
            return  # the container asks for no GPU
        request.parse(ours)  # bad annotations fail here, with the parser's one line
        slices.reserve(cid, ours, owner="hook")
        reserved_here = True
    try:
        slices.bind(cid, pid)
    except BaseException:
        if reserved_here:
            slices.release(cid)
        raise


def poststop(state: dict, slices: SliceManager) -> None:
    slices.release(state["id"])


def container_root(state: dict) -> str:
    """The container's root filesystem as the runtime sees it."""
    root = bundle_config(state).get("root", {}).get("path", "")
    if not root:
        raise HookError(f"container {state['id']}: config.json has no root.path")
    return str(Path(state["bundle"]) / root) if not root.startswith("/") else root

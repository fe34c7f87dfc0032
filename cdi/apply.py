"""Apply CDI container edits to an OCI runtime config (config.json), as the CDI
reference does for a CDI-aware runtime; the runtime shim uses it for runtimes
that know nothing of CDI.

Idempotent: an env entry replaces the one of the same name, a device node or a
mount replaces the one at the same container path, a cgroup rule or a hook that
is already there is not added again; applying the same devices twice gives the
same config.json.  Device `permissions` become the cgroup rule's access (rwm
when absent); mounts end sorted by depth (stable), so a parent is mounted before
what is mounted inside it."""

from __future__ import annotations

import os
import stat
from pathlib import PurePosixPath
from typing import Any

from gpuslice.cdi.registry import Found
from gpuslice.cdi.spec import ContainerEdits, DeviceNode, SpecError

Config = dict[str, Any]


def _host_node(n: DeviceNode) -> tuple[str, int, int, int]:
    """type, major, minor, mode of the host's node, where the spec leaves them out."""
    host = n.host_path or n.path
    try:
        st = os.stat(host)
    except OSError as e:
        raise SpecError(f"CDI device node {host}: {e.strerror}") from e
    kind = "c" if stat.S_ISCHR(st.st_mode) else "b" if stat.S_ISBLK(st.st_mode) else ""
    if not kind:
        raise SpecError(f"CDI device node {host} is not a character or block device")
    return kind, os.major(st.st_rdev), os.minor(st.st_rdev), stat.S_IMODE(st.st_mode)


def _set_env(config: Config, entries: tuple[str, ...]) -> None:
    env = config.setdefault("process", {}).setdefault("env", [])
    for entry in entries:
        name = entry.split("=", 1)[0]
        env[:] = [e for e in env if e.split("=", 1)[0] != name]
        env.append(entry)


def _add_device(config: Config, n: DeviceNode) -> None:
    if n.type and n.major is not None and n.minor is not None:
        kind, major, minor, mode = n.type, n.major, n.minor, n.file_mode
    else:
        kind, major, minor, host_mode = _host_node(n)
        mode = n.file_mode if n.file_mode is not None else host_mode
    node: dict[str, Any] = {"path": n.path, "type": kind, "major": major, "minor": minor}
    if mode is not None:
        node["fileMode"] = mode
    user = (config.get("process") or {}).get("user") or {}
    uid = n.uid if n.uid is not None else (user.get("uid") or None)  # as the CDI reference: the user's, if not root
    gid = n.gid if n.gid is not None else (user.get("gid") or None)
    if uid is not None:
        node["uid"] = uid
    if gid is not None:
        node["gid"] = gid
    linux = config.setdefault("linux", {})
    linux["devices"] = [d for d in linux.get("devices", []) if d.get("path") != n.path] + [node]
    if kind in ("c", "b"):
        rule = {"allow": True, "type": kind, "major": major, "minor": minor, "access": n.permissions or "rwm"}
        rules = linux.setdefault("resources", {}).setdefault("devices", [])
        rules[:] = [r for r in rules if not _same_device(r, rule)] + [rule]


def _same_device(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return bool(a.get("allow")) and all(a.get(k) == b[k] for k in ("type", "major", "minor"))


def _depth(mount: dict[str, Any]) -> int:
    return len(PurePosixPath(os.path.normpath(mount.get("destination", "/"))).parts)


def apply_edits(config: Config, edits: ContainerEdits) -> None:
    if edits.env:
        _set_env(config, edits.env)
    for n in edits.device_nodes:
        _add_device(config, n)
    for m in edits.mounts:
        mounts = [x for x in config.get("mounts", []) if x.get("destination") != m.container_path]
        entry: dict[str, Any] = {
            "destination": m.container_path,
            "type": m.type or "bind",
            "source": m.host_path,
            "options": list(m.options),
        }
        config["mounts"] = [*mounts, entry]
    for h in edits.hooks:
        entry = {"path": h.path}
        if h.args:
            entry["args"] = list(h.args)
        if h.env:
            entry["env"] = list(h.env)
        if h.timeout is not None:
            entry["timeout"] = h.timeout
        stage = config.setdefault("hooks", {}).setdefault(h.hook_name, [])
        if entry not in stage:
            stage.append(entry)
    if edits.additional_gids:
        user = config.setdefault("process", {}).setdefault("user", {"uid": 0, "gid": 0})
        gids = user.setdefault("additionalGids", [])
        gids.extend(g for g in edits.additional_gids if g not in gids)
    if edits.intel_rdt is not None:
        config.setdefault("linux", {})["intelRdt"] = dict(edits.intel_rdt)
    for nd in edits.net_devices:
        config.setdefault("linux", {}).setdefault("netDevices", {})[nd.host_interface_name] = {"name": nd.name}


def inject(config: Config, devices: list[Found]) -> None:
    """The resolved devices' edits: each spec's own edits once, then each device's,
    then the mounts in depth order."""
    applied: list[int] = []
    for found in devices:
        if id(found.spec) not in applied:
            apply_edits(config, found.spec.edits)
            applied.append(id(found.spec))
        apply_edits(config, found.device.edits)
    if config.get("mounts"):
        config["mounts"] = sorted(config["mounts"], key=_depth)

"""OCI runtime helpers: the state a runtime hands a hook, a bundle's config.json,
the container's annotations and type.  Pure functions over the runtime-spec's
documents; what the daemon does with them lives in gpuslice.allocator."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuslice import errors
from gpuslice.allocator.records import NO_WORKLOAD, Workload

CONFIG_NAME = "config.json"
MAX_CONFIG_BYTES = 16 << 20  # a config.json is kilobytes; never read a device or a huge file whole

# How the CRI implementations mark a pod's sandbox (pause) container.
SANDBOX_MARKS = (
    ("io.kubernetes.cri.container-type", "sandbox"),  # containerd
    ("io.kubernetes.cri-o.ContainerType", "sandbox"),  # CRI-O
)


# The pod's namespace and name and the container's name, as each CRI
# implementation writes them into every container's annotations: containerd's
# CRI plugin (its annotations package), and CRI-O (the kubelet's own container
# labels, which CRI-O also keeps as one JSON annotation).
WORKLOAD_KEYS = (
    ("io.kubernetes.cri.sandbox-namespace", "io.kubernetes.cri.sandbox-name", "io.kubernetes.cri.container-name"),
    ("io.kubernetes.pod.namespace", "io.kubernetes.pod.name", "io.kubernetes.container.name"),
)
CRIO_LABELS = "io.kubernetes.cri-o.Labels"


class OciError(errors.InvalidArgument):
    """A state or a bundle that is not what the runtime-spec says."""


@dataclass(frozen=True)
class State:
    """The OCI state (runtime-spec state.json) a hook reads on stdin."""

    id: str
    bundle: Path
    pid: int = 0
    annotations: dict[str, str] = field(default_factory=dict)


def parse_state(payload: bytes) -> State:
    try:
        data = json.loads(payload)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise OciError(f"the OCI state on stdin is not JSON: {e}") from e
    if not isinstance(data, dict) or not isinstance(data.get("id"), str) or not data.get("bundle"):
        raise OciError("the OCI state on stdin has no container id or bundle")
    pid = data.get("pid") or 0
    notes = data.get("annotations") or {}
    for name, value, want in (("bundle", data["bundle"], str), ("pid", pid, int), ("annotations", notes, dict)):
        if not isinstance(value, want) or isinstance(value, bool):
            got = {list: "a list", dict: "an object", str: "a string", bool: "a boolean"}.get(type(value), "a number")
            what = {str: "a path (a string)", int: "an integer", dict: "an object of strings"}[want]
            raise OciError(f"container {data['id']}: the OCI state's {name} is {got}; it must be {what}")
    return State(data["id"], Path(data["bundle"]), pid, {str(k): str(v) for k, v in notes.items()})


def read_config(bundle: Path, container_id: str = "") -> dict[str, Any]:
    """config.json of a bundle: a regular file of bounded size, never a FIFO or a device."""
    path = bundle / CONFIG_NAME
    who = f"container {container_id}: " if container_id else ""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise OciError(f"{who}cannot read {path}: {e.strerror}") from e
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OciError(f"{who}{path} is not a regular file")
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise OciError(f"{who}{path} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        config = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise OciError(f"{who}{path} is not JSON: {e}") from e
    if not isinstance(config, dict):
        raise OciError(f"{who}{path} is not a JSON object")
    return config


def annotations_of(config: dict[str, Any], state: State | None = None) -> dict[str, str]:
    """The container's annotations: config.json's, with the state's over them."""
    notes = config.get("annotations") or {}
    return {**{str(k): str(v) for k, v in notes.items()}, **(state.annotations if state else {})}


def is_sandbox(notes: dict[str, str]) -> bool:
    """A CRI pod's sandbox (pause) container, which never gets a GPU."""
    return any(notes.get(key) == value for key, value in SANDBOX_MARKS)


def workload_of(notes: dict[str, str]) -> Workload:
    """The Kubernetes workload a CRI runtime's container belongs to; nothing
    for a container no CRI made (Podman, Docker, ctr)."""
    for keys in WORKLOAD_KEYS:
        if notes.get(keys[1]):
            return Workload(*(notes.get(k, "") for k in keys))
    try:
        labels = json.loads(notes.get(CRIO_LABELS) or "{}")
    except ValueError:
        return NO_WORKLOAD
    if isinstance(labels, dict) and labels.get(WORKLOAD_KEYS[1][1]):
        return Workload(*(str(labels.get(k, "")) for k in WORKLOAD_KEYS[1]))
    return NO_WORKLOAD


def root_path(bundle: Path, config: dict[str, Any], container_id: str = "") -> Path:
    """The container's root filesystem as the runtime sees it."""
    root = (config.get("root") or {}).get("path", "")
    if not root:
        raise OciError(f"container {container_id}: config.json has no root.path")
    return Path(root) if root.startswith("/") else bundle / root


def process_env(config: dict[str, Any]) -> list[str]:
    return list((config.get("process") or {}).get("env") or [])

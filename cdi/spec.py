"""The CDI model: a spec, its devices and their container edits, as one set of
records that every part of gpuslice reads, validates, writes and applies.

Follows the CDI specification (SPEC.md of the container-device-interface
project): our own schema for the fields, the naming rules a schema cannot say,
and the lowest `cdiVersion` the fields need, from the version table below.
Files are JSON or YAML (by suffix) and are written atomically, mode 0644."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuslice import constants, errors
from gpuslice.atomic_file import write_text_atomically

KIND = constants.CDI_KIND
HOOK_NAMES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
DEFAULT_MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")

_VENDOR = r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?"
_CLASS = r"[a-zA-Z0-9]([a-zA-Z0-9_.-]*[a-zA-Z0-9])?"
_KIND_RE = re.compile(rf"^{_VENDOR}/{_CLASS}$")
_NAME_RE = re.compile(r"^[a-zA-Z0-9]([a-zA-Z0-9_.:-]*[a-zA-Z0-9])?$")


class SpecError(errors.FailedPrecondition):
    """A spec that cannot be used; str() names what is wrong, one line per problem."""


# -- the records ---------------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceNode:
    path: str
    host_path: str | None = None
    type: str | None = None  # "c" or "b"; read from the host node when absent
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = None
    permissions: str | None = None  # cgroup access, "rwm" when absent
    uid: int | None = None
    gid: int | None = None


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = DEFAULT_MOUNT_OPTIONS
    type: str | None = None


@dataclass(frozen=True)
class Hook:
    hook_name: str
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    timeout: int | None = None


@dataclass(frozen=True)
class NetDevice:
    host_interface_name: str
    name: str


@dataclass(frozen=True)
class ContainerEdits:
    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()
    net_devices: tuple[NetDevice, ...] = ()
    additional_gids: tuple[int, ...] = ()
    intel_rdt: dict[str, Any] | None = None

    def __bool__(self) -> bool:
        return any(
            (
                self.env,
                self.device_nodes,
                self.mounts,
                self.hooks,
                self.net_devices,
                self.additional_gids,
                self.intel_rdt,
            )
        )


@dataclass(frozen=True)
class Device:
    name: str
    edits: ContainerEdits
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Spec:
    kind: str
    devices: tuple[Device, ...]
    edits: ContainerEdits = ContainerEdits()
    annotations: dict[str, str] = field(default_factory=dict)
    version: str | None = None  # the cdiVersion a file declared; None: the minimum the fields need

    def device(self, name: str) -> Device:
        for d in self.devices:
            if d.name == name:
                return d
        raise SpecError(f"CDI spec of kind {self.kind} has no device {name!r}; it has {self.device_names()}")

    def device_names(self) -> str:
        return ", ".join(d.name for d in self.devices)

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": self.kind}
        if self.annotations:
            body["annotations"] = dict(self.annotations)
        body["devices"] = [_device_dict(d) for d in self.devices]
        if self.edits:
            body["containerEdits"] = _edits_dict(self.edits)
        return {"cdiVersion": self.version or minimum_version(self), **body}


# -- the minimum version -----------------------------------------------------------------------
def _all_edits(spec: Spec) -> list[ContainerEdits]:
    return [spec.edits, *(d.edits for d in spec.devices)]


# (version, what needs it, does this spec use it); the CDI specification's table of changes
VERSION_RULES: tuple[tuple[str, str, Callable[[Spec], bool]], ...] = (
    ("0.4.0", "a mount type", lambda s: any(m.type for e in _all_edits(s) for m in e.mounts)),
    ("0.5.0", "a device node hostPath", lambda s: any(n.host_path for e in _all_edits(s) for n in e.device_nodes)),
    ("0.5.0", "a device name that starts with a digit", lambda s: any(d.name[:1].isdigit() for d in s.devices)),
    ("0.6.0", "annotations", lambda s: bool(s.annotations) or any(d.annotations for d in s.devices)),
    ("0.6.0", "a dot in the kind's class", lambda s: "." in s.kind.partition("/")[2]),
    ("0.7.0", "additionalGids", lambda s: any(e.additional_gids for e in _all_edits(s))),
    ("0.7.0", "intelRdt", lambda s: any(e.intel_rdt is not None for e in _all_edits(s))),
    ("1.1.0", "netDevices", lambda s: any(e.net_devices for e in _all_edits(s))),
)
LOWEST_VERSION = "0.3.0"
KNOWN_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


def minimum_version(spec: Spec) -> str:
    """The lowest cdiVersion whose rules admit this spec's fields (older runtimes,
    Podman 4 among them, refuse versions they do not know)."""
    needed = [v for v, _, uses in VERSION_RULES if uses(spec)]
    return max([LOWEST_VERSION, *needed], key=_version_key)


# -- validation ------------------------------------------------------------------------------------
_STR_LIST = {"type": "array", "items": {"type": "string"}}
_ABS = {"type": "string", "pattern": "^/"}
_UINT32 = {"type": "integer", "minimum": 0, "maximum": 4294967295}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["cdiVersion", "kind", "devices"],
    "properties": {
        "cdiVersion": {"enum": list(KNOWN_VERSIONS)},
        "kind": {"type": "string"},
        "annotations": {"$ref": "#/$defs/annotations"},
        "devices": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "containerEdits"],
                "properties": {
                    "name": {"type": "string"},
                    "annotations": {"$ref": "#/$defs/annotations"},
                    "containerEdits": {"$ref": "#/$defs/edits"},
                },
                "additionalProperties": False,
            },
        },
        "containerEdits": {"$ref": "#/$defs/edits"},
    },
    "additionalProperties": False,
    "$defs": {
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        "edits": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "env": {"type": "array", "items": {"type": "string", "pattern": "^[^=]+=.*$"}},
                "deviceNodes": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["path"],
                        "properties": {
                            "path": _ABS,
                            "hostPath": _ABS,
                            "type": {"enum": ["c", "b", "u", "p"]},
                            "major": {"type": "integer"},
                            "minor": {"type": "integer"},
                            "fileMode": _UINT32,
                            "permissions": {"type": "string", "pattern": "^[rwm]+$"},
                            "uid": _UINT32,
                            "gid": _UINT32,
                        },
                        "additionalProperties": False,
                    },
                },
                "mounts": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["hostPath", "containerPath"],
                        "properties": {
                            "hostPath": _ABS,
                            "containerPath": _ABS,
                            "options": _STR_LIST,
                            "type": {"type": "string"},
                        },
                        "additionalProperties": False,
                    },
                },
                "hooks": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["hookName", "path"],
                        "properties": {
                            "hookName": {"enum": list(HOOK_NAMES)},
                            "path": _ABS,
                            "args": _STR_LIST,
                            "env": _STR_LIST,
                            "timeout": _UINT32,
                        },
                        "additionalProperties": False,
                    },
                },
                "netDevices": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["hostInterfaceName", "name"],
                        "properties": {"hostInterfaceName": {"type": "string"}, "name": {"type": "string"}},
                        "additionalProperties": False,
                    },
                },
                "additionalGids": {"type": "array", "items": _UINT32},
                "intelRdt": {"type": "object"},
            },
        },
    },
}


def validate(data: dict[str, Any]) -> Spec:
    """Our schema plus the CDI rules a schema cannot say; the parsed spec."""
    import jsonschema  # only validation needs it; starting a container does not

    problems = [
        f"{'.'.join(str(p) for p in e.absolute_path) or '(top level)'}: {e.message}"
        for e in jsonschema.Draft202012Validator(SCHEMA).iter_errors(data)
    ]
    if problems:
        raise SpecError("\n".join(problems))
    spec = from_dict(data)
    if not _KIND_RE.match(spec.kind):
        problems.append(f'kind: "{spec.kind}" is not vendor.com/class')
    seen: set[str] = set()
    for i, d in enumerate(spec.devices):
        if not _NAME_RE.match(d.name):
            problems.append(f'devices.{i}.name: "{d.name}" is not a valid CDI device name')
        if d.name in seen:
            problems.append(f'devices.{i}.name: "{d.name}" appears twice')
        seen.add(d.name)
    need = minimum_version(spec)
    if _version_key(data["cdiVersion"]) < _version_key(need):
        why = "; ".join(what for v, what, uses in VERSION_RULES if uses(spec) and v == need)
        problems.append(f"cdiVersion: {data['cdiVersion']} is too low for the fields used ({why}); needs {need}")
    if problems:
        raise SpecError("\n".join(problems))
    return spec


# -- dicts <-> records ----------------------------------------------------------------------------------
def from_dict(data: dict[str, Any]) -> Spec:
    """A spec from its document (validate() checks it first)."""
    return Spec(
        kind=data["kind"],
        devices=tuple(
            Device(d["name"], _edits(d.get("containerEdits") or {}), dict(d.get("annotations") or {}))
            for d in data["devices"]
        ),
        edits=_edits(data.get("containerEdits") or {}),
        annotations=dict(data.get("annotations") or {}),
        version=data.get("cdiVersion"),
    )


def _edits(e: dict[str, Any]) -> ContainerEdits:
    return ContainerEdits(
        env=tuple(e.get("env") or ()),
        device_nodes=tuple(
            DeviceNode(
                n["path"],
                n.get("hostPath"),
                n.get("type"),
                n.get("major"),
                n.get("minor"),
                n.get("fileMode"),
                n.get("permissions"),
                n.get("uid"),
                n.get("gid"),
            )
            for n in e.get("deviceNodes") or ()
        ),
        mounts=tuple(
            Mount(m["hostPath"], m["containerPath"], tuple(m.get("options") or DEFAULT_MOUNT_OPTIONS), m.get("type"))
            for m in e.get("mounts") or ()
        ),
        hooks=tuple(
            Hook(h["hookName"], h["path"], tuple(h.get("args") or ()), tuple(h.get("env") or ()), h.get("timeout"))
            for h in e.get("hooks") or ()
        ),
        net_devices=tuple(NetDevice(n["hostInterfaceName"], n["name"]) for n in e.get("netDevices") or ()),
        additional_gids=tuple(e.get("additionalGids") or ()),
        intel_rdt=e.get("intelRdt"),
    )


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None and v != () and v != []}


def _edits_dict(e: ContainerEdits) -> dict[str, Any]:
    return _drop_none(
        {
            "env": list(e.env),
            "deviceNodes": [
                _drop_none(
                    {
                        "path": n.path,
                        "hostPath": n.host_path,
                        "type": n.type,
                        "major": n.major,
                        "minor": n.minor,
                        "fileMode": n.file_mode,
                        "permissions": n.permissions,
                        "uid": n.uid,
                        "gid": n.gid,
                    }
                )
                for n in e.device_nodes
            ],
            "mounts": [
                _drop_none(
                    {
                        "hostPath": m.host_path,
                        "containerPath": m.container_path,
                        "options": list(m.options),
                        "type": m.type,
                    }
                )
                for m in e.mounts
            ],
            "hooks": [
                _drop_none(
                    {
                        "hookName": h.hook_name,
                        "path": h.path,
                        "args": list(h.args),
                        "env": list(h.env),
                        "timeout": h.timeout,
                    }
                )
                for h in e.hooks
            ],
            "netDevices": [{"hostInterfaceName": n.host_interface_name, "name": n.name} for n in e.net_devices],
            "additionalGids": list(e.additional_gids),
            "intelRdt": e.intel_rdt,
        }
    )


def _device_dict(d: Device) -> dict[str, Any]:
    out: dict[str, Any] = {"name": d.name}
    if d.annotations:
        out["annotations"] = dict(d.annotations)
    out["containerEdits"] = _edits_dict(d.edits)
    return out


# -- files ---------------------------------------------------------------------------------------------------
SUFFIXES = (".json", ".yaml", ".yml")


def parse_text(text: str, suffix: str) -> dict[str, Any]:
    data = yaml.safe_load(text) if suffix in (".yaml", ".yml") else json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("the document is not an object")
    return data


def load(path: Path) -> Spec:
    """A spec file (JSON or YAML by its suffix), validated."""
    try:
        text = path.read_text()
    except (OSError, ValueError) as e:
        raise SpecError(f"{path}: cannot read a CDI spec: {' '.join(str(e).split())}") from e
    return load_from(text, path)


def load_from(text: str, path: Path) -> Spec:
    """The text of the spec file at `path` (its suffix says JSON or YAML), validated;
    SpecError lines name the file."""
    try:
        data = parse_text(text, path.suffix)
    except (ValueError, yaml.YAMLError) as e:
        raise SpecError(f"{path}: cannot read a CDI spec: {' '.join(str(e).split())}") from e
    try:
        return validate(data)
    except SpecError as e:
        raise SpecError("\n".join(f"{path}: {line}" for line in str(e).splitlines())) from e


def render(spec: Spec, suffix: str = ".json") -> str:
    """The spec validated, as the text of a file with this suffix (YAML for .yaml/.yml)."""
    data = spec.to_dict()
    validate(data)
    text = yaml.safe_dump(data, sort_keys=False) if suffix in (".yaml", ".yml") else json.dumps(data, indent=2)
    return text.rstrip("\n") + "\n"


def write(spec: Spec, path: Path) -> None:
    """Validate, then write atomically (temp file + rename), mode 0644."""
    write_text_atomically(path, render(spec, path.suffix), 0o644)

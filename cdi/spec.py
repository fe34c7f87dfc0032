"""CDI specs: the model, the lowest cdiVersion its fields need, validation
(our schema and the CDI naming rules) and atomic writing."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from gpuslice.atomic_file import write_text_atomically

KIND = "gpuslice.io/gpu"
SPEC_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))

_KIND = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(\.[a-z0-9]+)*/[a-zA-Z0-9]([a-zA-Z0-9_.-]*[a-zA-Z0-9])?$")
_NAME = re.compile(r"^[a-zA-Z0-9]([a-zA-Z0-9_.:-]*[a-zA-Z0-9])?$")
HOOK_NAMES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")

SCHEMA = {
    "type": "object",
    "required": ["cdiVersion", "kind", "devices"],
    "properties": {
        "cdiVersion": {"type": "string", "pattern": r"^0\.[3-8]\.0$"},
        "kind": {"type": "string"},
        "devices": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "containerEdits"],
                "properties": {"name": {"type": "string"}, "containerEdits": {"$ref": "#/$defs/edits"}},
                "additionalProperties": False,
            },
        },
        "containerEdits": {"$ref": "#/$defs/edits"},
    },
    "additionalProperties": False,
    "$defs": {
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
                            "path": {"type": "string", "pattern": "^/"},
                            "hostPath": {"type": "string", "pattern": "^/"},
                            "permissions": {"type": "string", "pattern": "^[rwm]+$"},
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
                            "hostPath": {"type": "string", "pattern": "^/"},
                            "containerPath": {"type": "string", "pattern": "^/"},
                            "options": {"type": "array", "items": {"type": "string"}},
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
                            "path": {"type": "string", "pattern": "^/"},
                            "args": {"type": "array", "items": {"type": "string"}},
                            "env": {"type": "array", "items": {"type": "string"}},
                        },
                        "additionalProperties": False,
                    },
                },
            },
        }
    },
}


class SpecError(ValueError):
    """str() names what is wrong, one line per problem."""


@dataclass
class Mount:
    host_path: str
    container_path: str
    options: list[str] = field(default_factory=lambda: ["ro", "nosuid", "nodev", "bind"])

    def to_dict(self) -> dict:
        return {"hostPath": self.host_path, "containerPath": self.container_path, "options": self.options}


@dataclass
class Hook:
    hook_name: str
    path: str
    args: list[str]
    env: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = {"hookName": self.hook_name, "path": self.path, "args": self.args}
        if self.env:
            d["env"] = self.env
        return d


@dataclass
class Edits:
    env: list[str] = field(default_factory=list)
    device_nodes: list[str] = field(default_factory=list)
    mounts: list[Mount] = field(default_factory=list)
    hooks: list[Hook] = field(default_factory=list)

    def to_dict(self) -> dict:
        d: dict = {}
        if self.env:
            d["env"] = self.env
        if self.device_nodes:
            d["deviceNodes"] = [{"path": p} for p in self.device_nodes]
        if self.mounts:
            d["mounts"] = [m.to_dict() for m in self.mounts]
        if self.hooks:
            d["hooks"] = [h.to_dict() for h in self.hooks]
        return d


@dataclass
class Device:
    name: str
    edits: Edits

    def to_dict(self) -> dict:
        return {"name": self.name, "containerEdits": self.edits.to_dict()}


@dataclass
class Spec:
    devices: list[Device]
    edits: Edits
    kind: str = KIND

    def to_dict(self) -> dict:
        body = {"kind": self.kind, "devices": [d.to_dict() for d in self.devices]}
        if self.edits.to_dict():
            body["containerEdits"] = self.edits.to_dict()
        return {"cdiVersion": minimum_version(body), **body}


def minimum_version(spec: dict) -> str:
    """The lowest cdiVersion whose rules admit these fields: 0.5.0 is needed for
    device names that start with a digit and for deviceNodes with hostPath;
    0.6.0 for annotations; otherwise 0.3.0."""
    version = (0, 3, 0)
    names = [d.get("name", "") for d in spec.get("devices", [])]
    edits = [spec.get("containerEdits", {}), *(d.get("containerEdits", {}) for d in spec.get("devices", []))]
    if any(n[:1].isdigit() for n in names) or any("hostPath" in n for e in edits for n in e.get("deviceNodes", [])):
        version = max(version, (0, 5, 0))
    if "annotations" in spec or any("annotations" in d for d in spec.get("devices", [])):
        version = max(version, (0, 6, 0))
    return ".".join(map(str, version))


def validate(spec: dict) -> None:
    """Our schema plus the CDI rules a schema cannot say."""
    import jsonschema  # only validation needs it; starting a container does not

    problems = [
        f"{'.'.join(str(p) for p in e.absolute_path) or '(top level)'}: {e.message}"
        for e in jsonschema.Draft202012Validator(SCHEMA).iter_errors(spec)
    ]
    if not problems:
        if not _KIND.match(spec["kind"]):
            problems.append(f'kind: "{spec["kind"]}" is not vendor.com/class')
        seen = set()
        for i, d in enumerate(spec["devices"]):
            if not _NAME.match(d["name"]):
                problems.append(f'devices.{i}.name: "{d["name"]}" is not a valid CDI device name')
            if d["name"] in seen:
                problems.append(f'devices.{i}.name: "{d["name"]}" appears twice')
            seen.add(d["name"])
        need = minimum_version(spec)
        if tuple(map(int, spec["cdiVersion"].split("."))) < tuple(map(int, need.split("."))):
            problems.append(f"cdiVersion: {spec['cdiVersion']} is too low for the fields used; needs {need}")
    if problems:
        raise SpecError("\n".join(problems))


def write(spec: dict, path: Path) -> None:
    """Validate, then write atomically (temp file + rename), mode 0644."""
    validate(spec)
    write_text_atomically(path, json.dumps(spec, indent=2) + "\n", 0o644)


def load(path: Path) -> dict:
    try:
        spec = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SpecError(f"{path}: cannot read a CDI spec: {e}") from e
    validate(spec)
    return spec


def find_specs(kind: str = KIND, dirs: tuple[Path, ...] = SPEC_DIRS) -> list[Path]:
    found = []
    for d in dirs:
        for p in sorted(d.glob("*.json")) if d.is_dir() else []:
            try:
                if json.loads(p.read_text()).get("kind") == kind:
                    found.append(p)
            except (OSError, json.JSONDecodeError):
                continue
    return found

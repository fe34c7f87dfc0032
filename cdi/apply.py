"""Apply CDI container edits to an OCI runtime config (config.json), as a
CDI-aware runtime would: for the runtime shim, which serves runtimes that
know nothing of CDI."""

from __future__ import annotations

import os
import stat


def _set_env(process: dict, entries: list[str]) -> None:
    env = process.setdefault("env", [])
    for entry in entries:
        key = entry.split("=", 1)[0]
        env[:] = [e for e in env if e.split("=", 1)[0] != key]
        env.append(entry)


def _device(path: str) -> tuple[dict, dict]:
    st = os.stat(path)
    kind = "c" if stat.S_ISCHR(st.st_mode) else "b" if stat.S_ISBLK(st.st_mode) else None
    if kind is None:
        raise ValueError(f"CDI device node {path} is not a device")
    major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
    node = {"path": path, "type": kind, "major": major, "minor": minor, "fileMode": stat.S_IMODE(st.st_mode),
            "uid": 0, "gid": 0}  # fmt: skip
    rule = {"allow": True, "type": kind, "major": major, "minor": minor, "access": "rwm"}
    return node, rule


def apply_edits(config: dict, edits: dict) -> None:
    if edits.get("env"):
        _set_env(config.setdefault("process", {}), edits["env"])
    for n in edits.get("deviceNodes", []):
        node, rule = _device(n.get("hostPath", n["path"]))
        node["path"] = n["path"]
        linux = config.setdefault("linux", {})
        linux.setdefault("devices", []).append(node)
        linux.setdefault("resources", {}).setdefault("devices", []).append(rule)
    for m in edits.get("mounts", []):
        config.setdefault("mounts", []).append(
            {
                "destination": m["containerPath"],
                "type": "bind",
                "source": m["hostPath"],
                "options": m.get("options", ["ro", "nosuid", "nodev", "bind"]),
            }
        )
    for h in edits.get("hooks", []):
        entry = {"path": h["path"]}
        for key in ("args", "env"):
            if h.get(key):
                entry[key] = h[key]
        config.setdefault("hooks", {}).setdefault(h["hookName"], []).append(entry)


def apply_devices(config: dict, spec: dict, names: list[str]) -> None:
    """The spec's own edits, then each named device's."""
    by_name = {d["name"]: d for d in spec["devices"]}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise KeyError(f"CDI spec {spec['kind']} has no device {', '.join(missing)}")
    apply_edits(config, spec.get("containerEdits", {}))
    for n in names:
        apply_edits(config, by_name[n]["containerEdits"])

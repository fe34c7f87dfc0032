"""`gpuslice install|uninstall RUNTIME`: drop-in configuration the way each
ecosystem expects it.  Idempotent; a dry run prints the change as a diff."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuslice import request
from gpuslice.atomic_file import write_text_atomically

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

RUNTIME_NAME = "gpuslice"
ANNOTATION_REGEX = "^gpuslice\\.io/(" + "|".join(re.escape(k.split("/", 1)[1]) for k in request.KNOWN) + ")$"


@dataclass(frozen=True)
class Change:
    path: Path
    before: str | None  # None: the file does not exist
    after: str | None  # None: the file goes away

    @property
    def changes(self) -> bool:
        return self.before != self.after

    def diff(self) -> str:
        return "".join(
            difflib.unified_diff(
                (self.before or "").splitlines(keepends=True),
                (self.after or "").splitlines(keepends=True),
                fromfile=str(self.path) if self.before is not None else "/dev/null",
                tofile=str(self.path) if self.after is not None else "/dev/null",
            )
        )


def _read(path: Path) -> str | None:
    return path.read_text() if path.exists() else None


def apply(changes: list[Change]) -> None:
    for c in changes:
        if not c.changes:
            continue
        if c.after is None:
            c.path.unlink(missing_ok=True)
        else:
            write_text_atomically(c.path, c.after)


# ---- containerd ----------------------------------------------------------------

CONTAINERD_DROPIN = "etc/containerd/conf.d/gpuslice.toml"
CRI = 'plugins."io.containerd.grpc.v1.cri".containerd.runtimes'


def _runc_options(config: str | None) -> dict:
    if not config:
        return {}
    try:
        data = tomllib.loads(config)
    except tomllib.TOMLDecodeError:
        return {}
    runtimes = data.get("plugins", {}).get("io.containerd.grpc.v1.cri", {}).get("containerd", {}).get("runtimes", {})
    return runtimes.get("runc", {}).get("options", {})


def _toml_value(v: object) -> str:
    return json.dumps(v) if not isinstance(v, bool) else ("true" if v else "false")


def containerd(root: Path, shim: str, remove: bool) -> list[Change]:
    main_cfg = root / "etc/containerd/config.toml"
    dropin = root / CONTAINERD_DROPIN
    before_main = _read(main_cfg)
    target = "/" + CONTAINERD_DROPIN
    if remove:
        after_main = before_main
        if before_main and f'imports = ["{target}"]\n' in before_main:
            after_main = before_main.replace(f'imports = ["{target}"]\n', "")
        return [Change(main_cfg, before_main, after_main), Change(dropin, _read(dropin), None)]
    options = {k: v for k, v in _runc_options(before_main).items() if k != "BinaryName"}  # runc's options kept
    options["BinaryName"] = shim
    lines = [
        "# gpuslice: a runtime whose binary is the gpuslice shim (gpuslice install containerd)",
        "version = 2",
        f"[{CRI}.{RUNTIME_NAME}]",
        '  runtime_type = "io.containerd.runc.v2"',
        '  pod_annotations = ["gpuslice.io/*"]',
        '  container_annotations = ["gpuslice.io/*"]',
        f"[{CRI}.{RUNTIME_NAME}.options]",
        *(f"  {k} = {_toml_value(v)}" for k, v in sorted(options.items())),
    ]
    after_main = before_main
    if before_main is None:
        after_main = f'version = 2\nimports = ["{target}"]\n'
    elif target not in before_main:
        if re.search(r"^imports\s*=", before_main, re.M):
            after_main = re.sub(r"^(imports\s*=\s*\[)", rf'\1"{target}", ', before_main, count=1, flags=re.M)
        else:
            after_main = f'imports = ["{target}"]\n' + before_main
    return [Change(main_cfg, before_main, after_main), Change(dropin, _read(dropin), "\n".join(lines) + "\n")]


# ---- CRI-O ------------------------------------------------------------------------


def crio(root: Path, shim: str, remove: bool) -> list[Change]:
    path = root / "etc/crio/crio.conf.d/99-gpuslice.conf"
    text = (
        "# gpuslice: the gpuslice runtime for CRI-O (gpuslice install crio)\n"
        f"[crio.runtime.runtimes.{RUNTIME_NAME}]\n"
        f'runtime_path = "{shim}"\n'
        'runtime_type = "oci"\n'
        f"allowed_annotations = [{', '.join(json.dumps(k) for k in request.KNOWN)}]\n"
    )
    return [Change(path, _read(path), None if remove else text)]


# ---- Podman (and CRI-O's hooks) -------------------------------------------------


def hooks_d(hook: str) -> dict[str, str]:
    """hooks.d files: run the hook for containers with our annotations."""
    files = {}
    for stage in ("createRuntime", "poststop"):
        files[f"gpuslice-{stage.lower()}.json"] = (
            json.dumps(
                {
                    "version": "1.0.0",
                    "hook": {"path": hook, "args": ["gpuslice-hook", stage]},
                    "when": {"annotations": {ANNOTATION_REGEX: ".*"}},
                    "stages": [stage],
                },
                indent=2,
            )
            + "\n"
        )
    return files


def podman(root: Path, hook: str, remove: bool) -> list[Change]:
    d = root / "usr/share/containers/oci/hooks.d"
    return [Change(d / name, _read(d / name), None if remove else text) for name, text in hooks_d(hook).items()]


# ---- Docker ------------------------------------------------------------------------


def docker(root: Path, shim: str, remove: bool) -> list[Change]:
    path = root / "etc/docker/daemon.json"
    before = _read(path)
    data = json.loads(before) if before and before.strip() else {}
    runtimes = data.setdefault("runtimes", {})
    if remove:
        runtimes.pop(RUNTIME_NAME, None)
        if not runtimes:
            data.pop("runtimes")
    else:
        runtimes[RUNTIME_NAME] = {"path": shim}
    after = json.dumps(data, indent=2) + "\n" if data or before is not None else None
    if before is not None and after is not None and json.loads(before or "{}") == data:
        after = before  # unchanged content keeps its formatting
    return [Change(path, before, after)]


TARGETS: dict[str, Callable[[Path, str, bool], list[Change]]] = {
    "containerd": containerd,
    "crio": crio,
    "podman": podman,
    "docker": docker,
}


def plan(target: str, root: Path, shim: str, hook: str, remove: bool = False) -> list[Change]:
    fn = TARGETS[target]
    return fn(root, hook if target == "podman" else shim, remove)

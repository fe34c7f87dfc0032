"""`gpuslice install|uninstall RUNTIME`: drop-in configuration the way each
ecosystem expects it, for the runtime's version.  Idempotent; a dry run prints
the change as a diff; uninstall puts back each file as it was, byte for byte,
unless it was edited since (then only our part is taken out)."""

from __future__ import annotations

import copy
import difflib
import fnmatch
import json
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from gpuslice import errors, request
from gpuslice.cli.host_files import HostFiles

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

RUNTIME_NAME = "gpuslice"
ANNOTATION_REGEX = "^gpuslice\\.io/(" + "|".join(re.escape(k.split("/", 1)[1]) for k in request.KNOWN) + ")$"
# what install found before it wrote, so that uninstall can put it back
MANIFEST_DIR = "var/lib/gpuslice/install"
_VERSION = re.compile(r"(?:^|\s)v?(\d+)\.(\d+)\.\d+")


class InstallError(errors.FailedPrecondition):
    """The node's configuration or runtime is not one install can change."""


def runtime_version(binary: str) -> tuple[int, int]:
    """(major, minor) from `BINARY --version` (containerd, dockerd)."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise InstallError(
            f"{binary} --version: {getattr(e, 'strerror', None) or e}; accepted: the runtime on PATH, "
            "--runtime-binary PATH or --runtime-version X.Y"
        ) from None
    m = _VERSION.search(out)
    if not m:
        raise InstallError(f"{binary} --version: no version in {out.strip()[:80]!r}; accepted: --runtime-version X.Y")
    return int(m.group(1)), int(m.group(2))


def parse_version(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)\.(\d+)(\.\d+)?", text.strip())
    if not m:
        raise InstallError(f'--runtime-version: "{text}" is not valid; accepted: MAJOR.MINOR (1.7, 26.1)')
    return int(m.group(1)), int(m.group(2))


@dataclass
class Context:
    root: Path
    shim: str = ""
    hook: str = ""
    remove: bool = False
    binary: str = ""  # the runtime to ask its version: containerd, dockerd
    version: tuple[int, int] | None = None  # given: not asked
    config: Path | None = None  # containerd's config.toml where it is not ROOT/etc/containerd (k3s, ...)
    manifest_dir: Path | None = None  # where what install found is kept (default ROOT/var/lib/gpuslice/install)

    def runtime_version(self, default_binary: str) -> tuple[int, int]:
        return self.version or runtime_version(self.binary or default_binary)


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


# ---- containerd ----------------------------------------------------------------

CONTAINERD_DROPIN = "etc/containerd/conf.d/gpuslice.toml"
DROPIN_IMPORT = "conf.d/gpuslice.toml"  # containerd resolves it beside config.toml
CRI_V2 = "io.containerd.grpc.v1.cri"  # containerd 1.x, config version 2
CRI_V3 = "io.containerd.cri.v1.runtime"  # containerd 2.x, config version 3
RUNC_V2 = "io.containerd.runc.v2"


def _toml(text: str | None, path: Path) -> dict[str, Any]:
    if not text:
        return {}
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InstallError(f"{path}: not valid TOML ({e}); accepted: a containerd config file") from None


def _dig(data: dict[str, Any], *keys: str) -> dict[str, Any]:
    for key in keys:
        data = data.get(key, {}) if isinstance(data, dict) else {}
    return data if isinstance(data, dict) else {}


def _cri_plugin(main: dict[str, Any]) -> dict[str, Any]:
    """The node's CRI runtime section, wherever its config version keeps it."""
    return _dig(main, "plugins", CRI_V3) or _dig(main, "plugins", CRI_V2)


def _our_runtime(main: dict[str, Any], shim: str) -> dict[str, Any]:
    runc = _dig(_cri_plugin(main), "containerd", "runtimes", "runc")
    options = {k: v for k, v in _dig(runc, "options").items() if k != "BinaryName"}  # runc's options kept
    options["BinaryName"] = shim
    return {
        "runtime_type": RUNC_V2,
        # a pod's annotations reach every container of the pod (the shim skips its sandbox)
        "pod_annotations": ["gpuslice.io/*"],
        "container_annotations": ["gpuslice.io/*"],
        "options": options,
    }


def _dropin(main: dict[str, Any], shim: str, version: tuple[int, int]) -> tuple[str, dict[str, Any]]:
    ours = _our_runtime(main, shim)
    if version >= (2, 0):
        return "config version 3: containerd 2.x merges this with the node's CRI settings key by key", {
            "version": 3,
            "plugins": {CRI_V3: {"enable_cdi": True, "containerd": {"runtimes": {RUNTIME_NAME: ours}}}},
        }
    # containerd 1.6 and 1.7 replace a whole plugin section with an imported one:
    # carry the node's CRI section (runc, sandbox_image, ...) and add ours to it.
    cri = copy.deepcopy(_dig(main, "plugins", CRI_V2))
    if version >= (1, 7):
        cri["enable_cdi"] = True  # CDI devices in CRI (a DRA driver's, a device plugin's) from 1.7 on
    runtimes = cri.setdefault("containerd", {}).setdefault("runtimes", {})
    default = cri["containerd"].get("default_runtime_name", "runc")
    if default == "runc" and "runc" not in runtimes:
        runtimes["runc"] = {"runtime_type": RUNC_V2}  # containerd's own default, which the import would drop
    runtimes[RUNTIME_NAME] = ours
    return (
        "containerd 1.x replaces the CRI section with this one: it carries config.toml's CRI settings; "
        "after editing those, run `gpuslice install containerd` again",
        {"version": 2, "plugins": {CRI_V2: cri}},
    )


def _imported(main: dict[str, Any], cfg: Path, dropin: Path) -> bool:
    for pattern in main.get("imports", []):
        full = Path(pattern) if Path(pattern).is_absolute() else cfg.parent / pattern
        if str(pattern) in (DROPIN_IMPORT, "/" + CONTAINERD_DROPIN) or fnmatch.fnmatch(str(dropin), str(full)):
            return True
    return False


def containerd(ctx: Context) -> list[Change]:
    main_cfg = ctx.config or ctx.root / "etc/containerd/config.toml"
    dropin = main_cfg.parent / DROPIN_IMPORT
    before_main = _read(main_cfg)
    line = f'imports = ["{DROPIN_IMPORT}"]\n'
    if ctx.remove:
        after_main = before_main
        for ours in (line, 'imports = ["/etc/containerd/conf.d/gpuslice.toml"]\n', f'"{DROPIN_IMPORT}", '):
            after_main = after_main.replace(ours, "", 1) if after_main else after_main
        return [Change(main_cfg, before_main, after_main), Change(dropin, _read(dropin), None)]
    version = ctx.runtime_version("containerd")
    main = _toml(before_main, main_cfg)
    if before_main and main.get("version", 1) < 2:
        raise InstallError(
            f"{main_cfg}: config version {main.get('version', 1)} is not supported; accepted: version 2 or 3 "
            "(containerd config migrate)"
        )
    why, table = _dropin(main, ctx.shim, version)
    major, minor = version
    header = f"# gpuslice: the gpuslice runtime class (gpuslice install containerd, containerd {major}.{minor})\n"
    text = header + f"# {why}\n" + tomli_w.dumps(table)
    if before_main is None:
        after_main = f"version = {3 if version >= (2, 0) else 2}\n" + line
    elif _imported(main, main_cfg, dropin):
        after_main = before_main
    elif "imports" in main:
        after_main = re.sub(r"^(imports\s*=\s*\[)", rf'\1"{DROPIN_IMPORT}", ', before_main, count=1, flags=re.M)
    else:
        after_main = line + before_main
    return [Change(main_cfg, before_main, after_main), Change(dropin, _read(dropin), text)]


# ---- CRI-O ------------------------------------------------------------------------


def crio(ctx: Context) -> list[Change]:
    path = ctx.root / "etc/crio/crio.conf.d/99-gpuslice.conf"
    text = (
        "# gpuslice: the gpuslice runtime for CRI-O (gpuslice install crio)\n"
        f"[crio.runtime.runtimes.{RUNTIME_NAME}]\n"
        f'runtime_path = "{ctx.shim}"\n'
        'runtime_type = "oci"\n'
        f"allowed_annotations = [{', '.join(json.dumps(k) for k in request.ANNOTATIONS)}]\n"
    )
    return [Change(path, _read(path), None if ctx.remove else text)]


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


def podman(ctx: Context) -> list[Change]:
    d = ctx.root / "usr/share/containers/oci/hooks.d"
    return [Change(d / name, _read(d / name), None if ctx.remove else text) for name, text in hooks_d(ctx.hook).items()]


# ---- Docker ------------------------------------------------------------------------

DOCKER_CDI = (25, 0)  # the first engine with CDI devices (`features.cdi`)


def docker(ctx: Context) -> list[Change]:
    path = ctx.root / "etc/docker/daemon.json"
    before = _read(path)
    try:
        data = json.loads(before) if before and before.strip() else {}
    except json.JSONDecodeError as e:
        raise InstallError(f"{path}: not valid JSON ({e}); accepted: Docker's daemon.json") from None
    runtimes = data.setdefault("runtimes", {})
    if ctx.remove:
        runtimes.pop(RUNTIME_NAME, None)
        if not runtimes:
            data.pop("runtimes")
        # features.cdi stays: other CDI devices may rely on it, and it changes nothing without them
    else:
        runtimes[RUNTIME_NAME] = {"path": ctx.shim}
        if ctx.runtime_version("dockerd") >= DOCKER_CDI:
            data.setdefault("features", {})["cdi"] = True
    after = json.dumps(data, indent=2) + "\n" if data or before is not None else None
    if before is not None and after is not None and json.loads(before or "{}") == data:
        after = before  # unchanged content keeps its formatting
    return [Change(path, before, after)]


TARGETS: dict[str, Callable[[Context], list[Change]]] = {
    "containerd": containerd,
    "crio": crio,
    "podman": podman,
    "docker": docker,
}


def record_path(ctx: Context, target: str) -> Path:
    """Where `gpuslice install TARGET` records what it wrote (cli/host_files.py)."""
    return (ctx.manifest_dir or ctx.root / MANIFEST_DIR) / f"{target}.json"


def plan(target: str, ctx: Context, files: HostFiles) -> list[Change]:
    """The changes that install (or, with ctx.remove, uninstall) makes. On
    uninstall a file as install left it goes back to what it held before
    (`files`, the record); an edited one keeps the edits, less ours."""
    changes = TARGETS[target](ctx)
    if not ctx.remove:
        return changes
    restored = []
    for c in changes:
        after = files.restoring(c.path, None if c.after is None else c.after.encode())
        restored.append(Change(c.path, c.before, None if after is None else after.decode()))
    return restored


def apply(changes: list[Change], files: HostFiles, remove: bool) -> None:
    """Write the changes through the record: each file's first view is kept
    before it is written; on uninstall each path leaves the record, and the
    record goes once it holds none."""
    for c in changes:
        if remove:
            if c.path in files or c.changes:
                files.restore(c.path, None if c.after is None else c.after.encode())
        elif c.changes:
            assert c.after is not None  # install writes; it removes nothing
            files.put(c.path, c.after.encode(), c.path.stat().st_mode & 0o7777 if c.path.is_file() else 0o644)
    if remove:
        files.finish()

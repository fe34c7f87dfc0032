"""CDI spec directories, as the CDI reference reads them: every JSON or YAML file
in each directory, later directories over earlier ones (`/var/run/cdi`, where
specs are generated, overrides `/etc/cdi`, where an admin keeps static ones).
A device two files of one directory define is a conflict and neither is used;
a device a higher-priority directory defines replaces the lower one's.

Parsed specs are kept by path and the version of the file read (device, inode,
mtime, size, taken from the open file itself), so a long-lived reader (the
daemon, at every container start) validates a file once, not at every call: a
spec's schema check costs 0.6 ms, a third of a container's `create`."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpuslice.cdi.spec import KIND, SUFFIXES, Device, Spec, SpecError, load_from, parse_text, validate

log = logging.getLogger(__name__)

STATIC_DIR, DYNAMIC_DIR = Path("/etc/cdi"), Path("/var/run/cdi")  # an admin's specs; generated ones
SPEC_DIRS = (STATIC_DIR, DYNAMIC_DIR)  # lowest priority first
NAMED_KEPT = 16  # specs named outright (the shim's GPUSLICE_CDI_SPEC) kept parsed: a node has one or two
MAX_SPEC_BYTES = 16 << 20  # a spec is a few KiB; a larger file is refused, not read whole

Version = tuple[int, int, int, int]  # st_dev, st_ino, st_mtime_ns, st_size


def _read_versioned(path: Path) -> tuple[Version, str]:
    """The file's text and the version it was read at, both from one open file
    (a spec replaced between a stat and a read is never cached under the old one)."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_size > MAX_SPEC_BYTES:
            raise ValueError(f"{st.st_size} bytes; a CDI spec is at most {MAX_SPEC_BYTES}")
        text = f.read(MAX_SPEC_BYTES + 1).decode()
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size), text


def _version(path: Path) -> Version | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size


@dataclass(frozen=True)
class Found:
    """A device as the registry resolved it: the spec that defines it and where."""

    spec: Spec
    device: Device
    path: Path
    priority: int  # the index of its directory in the registry's dirs


class Registry:
    def __init__(self, dirs: tuple[Path, ...] = SPEC_DIRS) -> None:
        self.dirs = dirs
        self._parsed: dict[Path, tuple[Version, Spec | None]] = {}
        self._named: dict[Path, tuple[Version, Spec]] = {}  # oldest first, at most NAMED_KEPT
        self._named_lock = threading.Lock()

    def _read(self, path: Path, kind: str) -> Spec | None:
        now = _version(path)
        if now is None:
            return None  # gone since the directory was listed
        cached = self._parsed.get(path)
        if cached and cached[0] == now:
            return cached[1]
        spec: Spec | None = None
        try:
            version, text = _read_versioned(path)
        except (OSError, ValueError) as e:  # unreadable, too large, not UTF-8: said once per version
            log.warning("CDI spec %s skipped: %s", path, " ".join(str(e).split()))
            self._parsed[path] = (now, None)
            return None
        try:
            data = parse_text(text, path.suffix)
            if data.get("kind") == kind:
                spec = validate(data)
        except (ValueError, yaml.YAMLError) as e:
            log.warning("CDI spec %s skipped: %s", path, " ".join(str(e).split()))
        except SpecError as e:
            log.warning("CDI spec %s skipped: %s", path, "; ".join(str(e).splitlines()))
        self._parsed[path] = (version, spec)
        return spec

    def named(self, path: Path) -> Spec:
        """A spec file named outright, whatever its directory, validated once per
        version of the file; SpecError (naming the file) when it is not a valid spec."""
        with self._named_lock:
            cached = self._named.get(path)
        if cached and cached[0] == _version(path):
            return cached[1]
        try:
            version, text = _read_versioned(path)
        except (OSError, ValueError) as e:
            raise SpecError(f"{path}: cannot read a CDI spec: {' '.join(str(e).split())}") from e
        spec = load_from(text, path)
        with self._named_lock:
            self._named.pop(path, None)
            self._named[path] = (version, spec)
            while len(self._named) > NAMED_KEPT:
                del self._named[next(iter(self._named))]
        return spec

    def node(self, path: Path | None = None) -> tuple[Spec, Path]:
        """The node's gpuslice.io/gpu spec and its file: `path` when given, else the
        file whose `all` device the directories resolve; one SpecError line if none."""
        if path is not None:
            return self.named(path), path
        found = self.devices().get("all")
        if found is None:
            where = " or ".join(str(d) for d in self.dirs)
            raise SpecError(f"no {KIND}=all in {where} (`gpuslice cdi generate` writes it)")
        return found.spec, found.path

    def specs(self, kind: str = KIND) -> list[tuple[Path, int, Spec]]:
        """(path, priority, spec) of every valid spec of the kind, lowest priority first."""
        found, listed = [], set()
        for priority, d in enumerate(self.dirs):
            files = sorted(p for p in d.iterdir() if p.suffix in SUFFIXES) if d.is_dir() else []
            listed.update(files)
            for p in files:
                spec = self._read(p, kind)
                if spec is not None:
                    found.append((p, priority, spec))
        # a file gone is forgotten: /var/run/cdi sees a spec made and removed for every DRA claim
        for gone in [p for p in list(self._parsed) if p not in listed]:
            self._parsed.pop(gone, None)
        return found

    def devices(self, kind: str = KIND) -> dict[str, Found]:
        """Device name -> where it resolves, after the CDI priority and conflict rules."""
        chosen: dict[str, Found] = {}
        conflicted: dict[str, int] = {}  # name -> the priority at which two files define it
        for path, priority, spec in self.specs(kind):
            for device in spec.devices:
                held = chosen.get(device.name)
                if conflicted.get(device.name, -1) >= priority:
                    continue
                if held is not None and held.priority == priority:
                    log.warning(
                        "CDI device %s=%s: defined by %s and %s; neither is used", kind, device.name, held.path, path
                    )
                    conflicted[device.name] = priority
                    del chosen[device.name]
                    continue
                chosen[device.name] = Found(spec, device, path, priority)
        return chosen

    def resolve(self, names: list[str], kind: str = KIND) -> list[Found]:
        """The named devices of the kind, in order; one SpecError naming every missing one."""
        available = self.devices(kind)
        missing = [n for n in names if n not in available]
        if missing:
            where = " or ".join(str(d) for d in self.dirs)
            have = ", ".join(sorted(available)) or "none"
            raise SpecError(
                f"no CDI device {', '.join(f'{kind}={n}' for n in missing)} in {where} (devices there: {have}); "
                "run: gpuslice cdi generate"
            )
        return [available[n] for n in names]

"""CDI spec directories, as the CDI reference reads them: every JSON or YAML file
in each directory, later directories over earlier ones (`/var/run/cdi`, where
specs are generated, overrides `/etc/cdi`, where an admin keeps static ones).
A device two files of one directory define is a conflict and neither is used;
a device a higher-priority directory defines replaces the lower one's.

Parsed specs are kept by (path, mtime, size), so a long-lived reader (the
daemon, at every container start) validates a file once, not at every call."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpuslice.cdi.spec import KIND, SUFFIXES, Device, Spec, SpecError, parse_text, validate

log = logging.getLogger(__name__)

STATIC_DIR, DYNAMIC_DIR = Path("/etc/cdi"), Path("/var/run/cdi")  # an admin's specs; generated ones
SPEC_DIRS = (STATIC_DIR, DYNAMIC_DIR)  # lowest priority first


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
        self._parsed: dict[Path, tuple[tuple[int, int], Spec | None]] = {}

    def _read(self, path: Path, kind: str) -> Spec | None:
        try:
            st = path.stat()
        except OSError:
            return None
        key = (st.st_mtime_ns, st.st_size)
        cached = self._parsed.get(path)
        if cached and cached[0] == key:
            return cached[1]
        spec: Spec | None = None
        try:
            data = parse_text(path.read_text(), path.suffix)
            if data.get("kind") == kind:
                spec = validate(data)
        except (OSError, ValueError, yaml.YAMLError) as e:
            log.warning("CDI spec %s skipped: %s", path, " ".join(str(e).split()))
        except SpecError as e:
            log.warning("CDI spec %s skipped: %s", path, "; ".join(str(e).splitlines()))
        self._parsed[path] = (key, spec)
        return spec

    def specs(self, kind: str = KIND) -> list[tuple[Path, int, Spec]]:
        """(path, priority, spec) of every valid spec of the kind, lowest priority first."""
        found = []
        for priority, d in enumerate(self.dirs):
            files = sorted(p for p in d.iterdir() if p.suffix in SUFFIXES) if d.is_dir() else []
            for p in files:
                spec = self._read(p, kind)
                if spec is not None:
                    found.append((p, priority, spec))
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

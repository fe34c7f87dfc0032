"""Files gpuslice puts on a host, each recorded so that it goes back as it
was: what the path held before (bytes and mode, a symlink's target, or
nothing), the directories made for it, and a digest of what was written.
The one recorder of `gpuslice install` (ROOT/var/lib/gpuslice/install/
TARGET.json) and of the node agent (its state directory's node-agent.json).

The record is written before each file: a process killed before it could
undo leaves it for the next one, which keeps the first view of each path, so
its undo restores the host as it was before any of them. A file edited since
it was written is not overwritten with the old view: it is left as it is (and
said), or given what the caller says instead (uninstall: the edits, less
ours). A record in the layout `gpuslice install` wrote before it used this
one ({"before": {path: text}, "wrote": {path: text}}) is read as one."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from gpuslice.atomic_file import write_bytes_atomically, write_text_atomically

log = logging.getLogger(__name__)


@dataclass
class Before:
    kind: str  # "file", "link" or "none"
    data: str = ""  # a file's bytes (base64) or a link's target
    mode: int = 0o644


@dataclass
class Entry:
    before: Before
    wrote: str  # sha256 of what was written


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _holds(path: Path, digest: str, mode: int) -> bool:
    if path.is_symlink() or not path.is_file():
        return False
    return _digest(path.read_bytes()) == digest and path.stat().st_mode & 0o7777 == mode


def _holds_content(path: Path, digest: str) -> bool:
    return path.is_file() and not path.is_symlink() and _digest(path.read_bytes()) == digest


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o7777 if path.is_file() else 0o644


def _from_install_manifest(data: dict) -> dict:
    """{"before": {path: text or None}, "wrote": {path: text}} as this record."""
    files = {}
    for path, wrote in data.get("wrote", {}).items():
        text = data.get("before", {}).get(path)
        before = Before("none") if text is None else Before("file", base64.b64encode(text.encode()).decode())
        files[path] = {"before": asdict(before), "wrote": _digest(wrote.encode()) if wrote is not None else ""}
    return {"files": files, "made_dirs": []}


def _now(path: Path) -> Before:
    if path.is_symlink():
        return Before("link", os.readlink(path))
    if path.is_file():
        return Before("file", base64.b64encode(path.read_bytes()).decode(), path.stat().st_mode & 0o7777)
    return Before("none")


class HostFiles:
    def __init__(self, record: Path) -> None:
        self.record = record
        self.entries: dict[str, Entry] = {}
        self.made_dirs: list[str] = []
        if record.exists():
            data = json.loads(record.read_text())
            if "files" not in data:  # gpuslice install's own layout, before this recorder
                data = _from_install_manifest(data)
            self.entries = {k: Entry(Before(**v["before"]), v["wrote"]) for k, v in data["files"].items()}
            self.made_dirs = list(data["made_dirs"])

    def __contains__(self, path: Path) -> bool:
        return str(path) in self.entries

    def _save(self) -> None:
        data = {"files": {k: asdict(v) for k, v in self.entries.items()}, "made_dirs": self.made_dirs}
        write_text_atomically(self.record, json.dumps(data, indent=1) + "\n", 0o600, durable=True)

    def note_parents(self, paths: list[Path]) -> list[Path]:
        """The missing directories above `paths`, recorded (before anything makes
        them) so that undo removes them again once empty."""
        missing = list(dict.fromkeys(d for p in paths for d in reversed(p.parents) if not d.exists()))
        for d in missing:
            if str(d) not in self.made_dirs:
                self.made_dirs.append(str(d))
        self._save()
        return missing

    def _make_parents(self, path: Path) -> None:
        for d in self.note_parents([path]):
            d.mkdir(mode=0o755, exist_ok=True)

    def put(self, path: Path, data: bytes, mode: int = 0o644) -> bool:
        """Write `path` (atomically: a running container keeps the file it has
        mounted); False when it already held exactly this."""
        key, digest = str(path), _digest(data)
        if key not in self.entries:
            self.entries[key] = Entry(_now(path), "")
        elif self.entries[key].wrote == digest and _holds(path, digest, mode):
            return False
        self.entries[key].wrote = digest
        self._make_parents(path)  # saves the record, before the file changes
        write_bytes_atomically(path, data, mode)
        return True

    def adopt(self, other: Path) -> None:
        """Take over another record (say, what `gpuslice install` kept before
        the node agent used this one): its paths not recorded here, then it goes."""
        if other.exists():
            theirs = HostFiles(other)
            for k, e in theirs.entries.items():
                self.entries.setdefault(k, e)
            self.made_dirs += [d for d in theirs.made_dirs if d not in self.made_dirs]
            self._save()
            other.unlink()

    def edited(self) -> list[str]:
        """The paths whose content is no longer what was written."""
        return [k for k, e in self.entries.items() if not _holds_content(Path(k), e.wrote)]

    def restoring(self, path: Path, otherwise: bytes | None) -> bytes | None:
        """What undoing `path` writes: what it held before, if it still holds
        what was written (a file; None: nothing); else `otherwise`."""
        entry = self.entries.get(str(path))
        if entry is None or not _holds_content(path, entry.wrote) or entry.before.kind == "link":
            return otherwise
        return base64.b64decode(entry.before.data) if entry.before.kind == "file" else None

    def restore(self, path: Path, otherwise: bytes | None) -> None:
        """`path` as `restoring` says (None: removed), and out of the record."""
        entry = self.entries.get(str(path))
        data = self.restoring(path, otherwise)
        mode = entry.before.mode if entry and entry.before.kind == "file" else _mode(path)
        if data is None:
            path.unlink(missing_ok=True)
        elif not (path.is_file() and path.read_bytes() == data):
            write_bytes_atomically(path, data, mode)
        self.entries.pop(str(path), None)
        self._save()

    def finish(self) -> None:
        """After the last path is restored: the directories made go (if empty), and the record."""
        left = []
        for d in sorted(self.made_dirs, key=lambda p: -len(Path(p).parts)):
            try:
                Path(d).rmdir()
            except FileNotFoundError:
                pass
            except OSError:  # not empty: a file still recorded, or something else lives there now
                left.append(d)
        self.made_dirs = left
        if self.entries:
            self._save()
        else:
            self.record.unlink(missing_ok=True)

    def undo(self) -> list[str]:
        """Every path back as it was; the record goes too. Returns what was left
        as it is (edited since it was written)."""
        kept = []
        for key, entry in reversed(list(self.entries.items())):
            path = Path(key)
            current = path.read_bytes() if path.is_file() and not path.is_symlink() else None
            if current is None or _digest(current) != entry.wrote:
                if current is not None or path.is_symlink():
                    kept.append(key)
                    log.warning("%s was changed since it was written: left as it is", key)
                continue
            b = entry.before
            if b.kind == "file":
                write_bytes_atomically(path, base64.b64decode(b.data), b.mode)
            elif b.kind == "link":
                path.unlink()
                path.symlink_to(b.data)
            else:
                path.unlink()
        self.entries = {}
        self.finish()
        self.made_dirs = []
        return kept

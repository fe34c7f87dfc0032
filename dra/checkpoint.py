"""The claims this node prepared, kept on disk (versioned JSON, written
atomically) so that a restart of the plugin knows what to unprepare and
answers a repeated NodePrepareResources with what it answered before."""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpuslice import errors
from gpuslice.atomic_file import write_text_atomically

VERSION = 1


@dataclass(frozen=True)
class Prepared:
    uid: str
    namespace: str
    name: str
    slice_id: str  # the daemon's container ID for the claim's slice
    spec: str  # the claim's CDI spec file
    devices: list[dict[str, Any]]  # what NodePrepareResources answered, per device


class Checkpoint:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self.claims: dict[str, Prepared] = self._load()

    def _load(self) -> dict[str, Prepared]:
        if not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as e:
            raise errors.FailedPrecondition(f"checkpoint {self.path}: unreadable ({e}); move it aside") from e
        if data.get("version") != VERSION:
            raise errors.FailedPrecondition(
                f"checkpoint {self.path}: version {data.get('version')}, this plugin reads {VERSION}"
            )
        return {uid: Prepared(**c) for uid, c in data["claims"].items()}

    def get(self, uid: str) -> Prepared | None:
        with self._lock:
            return self.claims.get(uid)

    def put(self, prepared: Prepared) -> None:
        with self._lock:
            self.claims[prepared.uid] = prepared
            self._save()

    def drop(self, uid: str) -> None:
        with self._lock:
            if self.claims.pop(uid, None) is not None:
                self._save()

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        data = {"version": VERSION, "claims": {uid: asdict(c) for uid, c in sorted(self.claims.items())}}
        write_text_atomically(self.path, json.dumps(data, indent=1) + "\n", 0o600)

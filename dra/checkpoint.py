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

    # memory follows disk: a change is made in memory only once the file holding it is on disk,
    # so a failed write leaves both as they were (never an answer for a claim not prepared)
    def put(self, prepared: Prepared) -> None:
        with self._lock:
            claims = {**self.claims, prepared.uid: prepared}
            self._save(claims)
            self.claims = claims

    def drop(self, uid: str) -> None:
        with self._lock:
            if uid not in self.claims:
                return
            claims = {k: v for k, v in self.claims.items() if k != uid}
            self._save(claims)
            self.claims = claims

    def _save(self, claims: dict[str, Prepared]) -> None:
        data = {"version": VERSION, "claims": {uid: asdict(c) for uid, c in sorted(claims.items())}}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_text_atomically(self.path, json.dumps(data, indent=1) + "\n", 0o600, durable=True)
        except OSError as e:
            raise errors.Unavailable(
                f"checkpoint {self.path}: {e.strerror or e} on {self.path.parent}; nothing was changed"
            ) from e

"""Files replaced whole: a temp file beside the target, then rename, so a
reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_text_atomically(path: Path, text: str, mode: int = 0o644, durable: bool = False) -> None:
    """`durable`: on disk before it returns (the file, then the rename in its
    directory), for records whose loss after a crash would be answered as kept."""
    write_bytes_atomically(path, text.encode(), mode, durable)


def write_bytes_atomically(path: Path, data: bytes, mode: int = 0o644, durable: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        dirfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dirfd)
        finally:
            os.close(dirfd)

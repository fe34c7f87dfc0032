"""The host's filesystem as this process reaches it: at / on a node, under
/host in the node agent's container. One way for every component to turn a
host path into one it can open (normalised first, so a `..` never leads out
of the root; links followed under the root, never this process's own /), and
a path it found back into the host's name for it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gpuslice import errors

MAX_LINKS = 40  # as the kernel's own limit on symlinks in one lookup


class HostPathError(errors.InvalidArgument):
    """A host path that is not one (relative), leads out of the root, or loops."""


def resolve_under(root: Path, path: Path) -> Path:
    """`path` (under `root`) with its symlinks followed as the host would: an
    absolute target is taken under `root`, never this process's own `/`."""
    rel = path.relative_to(root).parts
    here, links = root, 0
    todo = list(rel)
    while todo:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            here = here.parent if here != root else root
            continue
        step = here / part
        if not step.is_symlink():
            here = step
            continue
        links += 1
        if links > MAX_LINKS:
            raise HostPathError(f"{path}: too many levels of symbolic links")
        target = os.readlink(step)
        if target.startswith("/"):
            here = root
        todo = [*Path(target).parts[1 if target.startswith("/") else 0 :], *todo]
    return here


@dataclass(frozen=True)
class HostRoot:
    root: Path = Path("/")

    def here(self, host_path: str | Path, what: str = "path") -> Path:
        """A host path as this process reaches it."""
        p = Path(host_path)
        if not p.is_absolute():
            raise HostPathError(f"{what} {host_path}: not an absolute path; accepted: a path on the host")
        return self.root / Path(os.path.normpath(p)).relative_to("/")

    def resolve(self, host_path: str | Path, what: str = "path") -> Path:
        """here(), with the links on the way followed as the host follows them."""
        return resolve_under(self.root, self.here(host_path, what))

    def on_host(self, path: Path) -> str:
        """A path this process found under the root, as the host names it."""
        if self.root == Path("/"):
            return str(path)
        try:
            return "/" + str(path.relative_to(self.root))
        except ValueError:
            raise HostPathError(f"{path} is not under the host root {self.root}") from None

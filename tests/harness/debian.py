"""Packages of another Debian suite beside the system's: newer runtimes
(trixie's containerd 1.7 and Docker 26, sid's containerd 2.x) and the official
schemas and protos the tests check against (tests/harness/references.py),
fetched with a private apt configuration and unpacked with dpkg -x into the
repository's build/ directory.  The system's packages are never touched.

GPUSLICE_DEBIAN_MIRROR names another Debian mirror (a local one, say); the
default is Debian's own."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

from tests.harness import REPO

CACHE = REPO / "build" / "debian"
MIRROR = "http://deb.debian.org/debian"
SOURCES = """Types: deb
URIs: {mirror}
Suites: {suite}
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


class FetchError(RuntimeError):
    """A package could not be fetched or unpacked; the message is one line."""


def mirror() -> str:
    return os.environ.get("GPUSLICE_DEBIAN_MIRROR", "").strip() or MIRROR


def _apt_options(base: Path) -> list[str]:
    return [
        "-o", f"Dir::Etc::SourceParts={base / 'sources.list.d'}",
        "-o", "Dir::Etc::SourceList=/dev/null",
        "-o", f"Dir::State::Lists={base / 'lists'}",
        "-o", f"Dir::Cache={base / 'cache'}",
        "-o", "APT::Sandbox::User=root",
        "-o", "Debug::NoLocking=1",
    ]  # fmt: skip


def _one_line(text: str) -> str:
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    return lines[-1][-300:] if lines else "no output"


def unpacked(packages: tuple[str, ...], suite: str) -> Path:
    """A directory holding `packages` of Debian `suite` unpacked (usr/bin/...),
    fetched once and kept in build/debian between runs. FetchError, one line,
    names the package and the suite when it cannot be had."""
    what = f"{', '.join(packages)} from Debian {suite} ({mirror()})"
    if not shutil.which("apt-get") or not shutil.which("dpkg-deb"):
        raise FetchError(f"cannot fetch {what}: apt-get and dpkg-deb are needed")
    base = CACHE / suite
    tree = base / ("-".join(packages))
    done = tree / ".unpacked"
    (base / "sources.list.d").mkdir(parents=True, exist_ok=True)
    (base / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (base / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # pytest-xdist or two sessions: one fetch
        if done.exists():
            return tree
        (base / "sources.list.d" / f"{suite}.sources").write_text(SOURCES.format(mirror=mirror(), suite=suite))
        opts = _apt_options(base)
        debs = base / "debs"
        debs.mkdir(exist_ok=True)
        download = ["apt-get", *opts, "download", *(f"{p}/{suite}" for p in packages)]
        for cmd in (["apt-get", *opts, "update", "-qq"], download):
            try:
                r = subprocess.run(cmd, cwd=debs, capture_output=True, text=True, timeout=600)
            except subprocess.TimeoutExpired:
                raise FetchError(f"cannot fetch {what}: apt-get {cmd[len(opts) + 1]} took over 600 s") from None
            if r.returncode != 0:
                raise FetchError(f"cannot fetch {what}: {_one_line(r.stderr)}")
        tree.mkdir(parents=True, exist_ok=True)
        for p in packages:
            found = sorted(debs.glob(f"{p}_*.deb"))
            if not found:
                raise FetchError(f"cannot fetch {what}: apt-get downloaded no {p}_*.deb")
            r = subprocess.run(
                ["dpkg-deb", "-x", str(found[-1]), str(tree)], capture_output=True, text=True, timeout=300
            )
            if r.returncode != 0:
                raise FetchError(f"cannot unpack {found[-1].name} ({what}): {_one_line(r.stderr)}")
        done.touch()
    return tree

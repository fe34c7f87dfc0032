"""Newer runtimes beside the system's: a Debian package of another suite
(trixie's containerd 1.7 and Docker 26, sid's containerd 2.x), fetched with a
private apt configuration and unpacked with dpkg -x into the repository's
build/ directory.  The system's packages are never touched."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.harness import REPO

CACHE = REPO / "build" / "debian"
SOURCES = """Types: deb
URIs: http://deb.debian.org/debian
Suites: {suite}
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


def _apt_options(base: Path) -> list[str]:
    return [
        "-o", f"Dir::Etc::SourceParts={base / 'sources.list.d'}",
        "-o", "Dir::Etc::SourceList=/dev/null",
        "-o", f"Dir::State::Lists={base / 'lists'}",
        "-o", f"Dir::Cache={base / 'cache'}",
        "-o", "APT::Sandbox::User=root",
        "-o", "Debug::NoLocking=1",
    ]  # fmt: skip


def unpacked(packages: tuple[str, ...], suite: str) -> Path:
    """A directory holding `packages` of Debian `suite` unpacked (usr/bin/...),
    fetched once and kept in build/debian between runs."""
    if not shutil.which("apt-get"):
        pytest.skip("apt-get is needed to fetch newer runtimes from Debian")
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
        (base / "sources.list.d" / f"{suite}.sources").write_text(SOURCES.format(suite=suite))
        opts = _apt_options(base)
        debs = base / "debs"
        debs.mkdir(exist_ok=True)
        download = ["apt-get", *opts, "download", *(f"{p}/{suite}" for p in packages)]
        steps = [["apt-get", *opts, "update", "-qq"], download]
        for cmd in steps:
            r = subprocess.run(cmd, cwd=debs, capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd[:1] + cmd[-len(packages) :])}: {r.stderr.strip()[-400:]}")
        tree.mkdir(parents=True, exist_ok=True)
        for p in packages:
            (deb,) = sorted(debs.glob(f"{p}_*.deb"))[-1:]
            subprocess.run(["dpkg-deb", "-x", str(deb), str(tree)], check=True, timeout=300)
        done.touch()
    return tree

"""The Debian root filesystems the e2e tests run: the plugin and node agent
image's (`packaging/build.py image`) and the booted systemd node's. Each is a
debootstrap of one to two minutes, nearly all of it one core's work (the
node's: 60 s user of 67 s), so both are begun at once, on first use, for
whichever of them this session's tests need; that first use waits for both,
so no e2e test is measured beside a build (under pytest-xdist the measuring
tests run last, among themselves, tests/harness/scheduling.py)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.harness import REPO, debian, package_argv

ROOTFS_CACHE = REPO / "build" / "systemd-rootfs"
BUILD_TIMEOUT = 900


def _build_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gpuslice_packaging_build", REPO / "packaging" / "build.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def rootfs_packages() -> list[str]:
    """systemd, and what the .deb depends on. debootstrap resolves no alternatives
    and misses python3-cffi's python3-ply."""
    depends = [d.split()[0] for d in _build_module().DEB_DEPENDS]
    return sorted({"systemd", "systemd-sysv", "dbus", "python3-ply", *depends})


@dataclass
class Build:
    proc: subprocess.Popen[str]
    log: Path
    done: str | None = None  # what it made, once waited for

    def finish(self) -> None:
        try:
            self.proc.wait(timeout=BUILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def wait(self) -> str:
        if self.done is None:
            self.finish()
            out = self.log.read_text()
            assert self.proc.returncode == 0, out[-3000:]
            self.done = out.strip().splitlines()[-1] if out.strip() else ""
        return self.done


@dataclass
class Builds:
    """The builds this session needs, each begun once."""

    wanted: set[str]
    work: Path
    running: dict[str, Build] = field(default_factory=dict)

    def get(self, name: str) -> str:
        for n in sorted(self.wanted | {name}):
            if n not in self.running:
                self.running[n] = self._start(n)
        for b in self.running.values():  # the first use waits for every build (a failed one fails its
            b.finish()  # own tests): no test runs beside one
        return self.running[name].wait()

    def _start(self, name: str) -> Build:
        log = self.work / f"{name}.log"
        with open(log, "w") as out:
            if name == "image":
                argv = package_argv("image", self.work / "image")
                proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True)
            else:
                proc = _start_rootfs(out)
        return Build(proc, log)


def _start_rootfs(out) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    """A minimal Debian 12 with systemd, made once and kept while the package list is
    the same (the boot runs on an overlay of it, so it stays pristine)."""
    packages = ",".join(rootfs_packages())
    stamp = ROOTFS_CACHE / ".gpuslice-packages"
    if stamp.is_file() and stamp.read_text() == packages:
        return subprocess.Popen(["echo", str(ROOTFS_CACHE)], stdout=out, text=True)
    shutil.rmtree(ROOTFS_CACHE, ignore_errors=True)
    partial = ROOTFS_CACHE.with_name(ROOTFS_CACHE.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    # the stamp and the rename only once debootstrap has succeeded: a cut-off build is never taken
    script = ('debootstrap --variant=minbase --include="$1" bookworm "$2" "$3" >&2'
              ' && printf %s "$1" > "$2/.gpuslice-packages" && mv "$2" "$4" && echo "$4"')  # fmt: skip
    return subprocess.Popen(["sh", "-c", script, "rootfs", packages, str(partial), debian.mirror(), str(ROOTFS_CACHE)],
                            stdout=out, stderr=subprocess.STDOUT, text=True)  # fmt: skip


@pytest.fixture(scope="session")
def builds(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Builds:
    items = request.session.items
    wanted = {n for item in items for n in ("image", "rootfs") if n in getattr(item, "fixturenames", ())}
    return Builds(wanted, tmp_path_factory.mktemp("builds"))


@pytest.fixture(scope="session")
def image(builds: Builds) -> str:
    """`packaging/build.py image`: the plugin and node agent image, in podman's store."""
    archive = Path(builds.get("image"))
    assert archive.name.endswith(".oci.tar") and archive.stat().st_size > 0
    return "localhost/gpuslice/kubelet-plugin:" + archive.name.split("_")[1].removesuffix(".oci.tar")


@pytest.fixture(scope="session")
def rootfs(builds: Builds) -> Path:
    return Path(builds.get("rootfs"))

"""The build step both Python distributions share (setup.py for gpuslice,
sim/setup.py for gpuslice-sim): run the top-level `make` for the parts the
distribution ships and place them in its package's `_native/`.

An editable install links each part to the build directory, so a later `make`
is seen without reinstalling; a wheel gets copies of those parts only."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parents[1]
BUILT = ROOT / "build" / "native"


def _clear(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def _link(link: Path, target: Path) -> None:
    # relative, so that a checkout moved elsewhere keeps working
    link.symlink_to(os.path.relpath(target, link.parent), target_is_directory=True)


def native_build_py(target: str, package: str, source: Path, parts: tuple[str, ...]) -> type[build_py]:
    """A build_py that runs `make <target>` and ships `parts` of build/native/
    as `<package>/_native/<part>` (`source` is the package's directory in the
    tree).  A single part "." ships build/native/<target> as `_native` itself."""

    class BuildWithNative(build_py):
        def run(self) -> None:
            if not getattr(self, "editable_mode", False):
                # setuptools copies into build/lib and never deletes: a module
                # removed from the tree must not reach the wheel from there
                shutil.rmtree(Path(self.build_lib) / package, ignore_errors=True)
            super().run()
            subprocess.run(["make", "-C", str(ROOT), target], check=True)
            editable = getattr(self, "editable_mode", False)
            native = (source if editable else Path(self.build_lib) / package) / "_native"
            _clear(native)  # a stale build must not leak other parts into the wheel
            if parts == (".",):
                built = BUILT / target
                _link(native, built) if editable else shutil.copytree(built, native)
                return
            native.mkdir(parents=True)
            for part in parts:
                if editable:
                    _link(native / part, BUILT / part)
                else:
                    shutil.copytree(BUILT / part, native / part)

    return BuildWithNative

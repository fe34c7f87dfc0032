"""Where each part of the installed package `gpuslice` lives in the tree: the
one source is pyproject.toml's package-dir (the component directories are
mapped into the one package). The import-layer test and tools/typecheck.sh
read it here rather than restating it."""

from __future__ import annotations

import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def package_dirs() -> dict[str, str]:
    """Import name -> directory in the tree, e.g. {"gpuslice.cdi": "cdi"}."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return dict(project["tool"]["setuptools"]["package-dir"])


if __name__ == "__main__":
    # for the shell: "NAME DIRECTORY" per line
    for name, directory in package_dirs().items():
        sys.stdout.write(f"{name} {directory}\n")

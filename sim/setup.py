"""Build hook of gpuslice-sim: compile the simulated driver (`make sim` at the
top of the source tree, which holds the declarations it shares with the
interposer) and ship it inside gpuslice_sim/_native/."""

import sys
from pathlib import Path

import tomllib
from setuptools import setup

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from tools.native_build import native_build_py  # noqa: E402

# one version for both distributions: gpuslice's
VERSION = tomllib.loads((HERE.parent / "pyproject.toml").read_text())["project"]["version"]

setup(version=VERSION, cmdclass={"build_py": native_build_py("sim", "gpuslice_sim", HERE / "gpuslice_sim", (".",))})

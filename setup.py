"""Build hook: compile the node's C parts (`make node` at the top) and ship them
inside the package (gpuslice/_native/), so installed code finds them beside
itself.  The simulator is not among them: it is gpuslice-sim (sim/setup.py)."""

import sys
from pathlib import Path

from setuptools import setup

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/, beside this file
from tools.native_build import native_build_py

NATIVE_PARTS = ("ledger", "wrap", "tools", "bin")

HERE = Path(__file__).resolve().parent
setup(cmdclass={"build_py": native_build_py("node", "gpuslice", HERE / "gpuslice", NATIVE_PARTS)})

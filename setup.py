"""Build hook: compile libcuda_wrap/ with make and ship the libraries inside
the package (gpuslice/_native/), so installed code finds them beside itself."""

import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
NATIVE_PARTS = ("sim",)


class BuildWithNative(build_py):
    def run(self) -> None:
        super().run()
        subprocess.run(["make", "-C", str(ROOT / "libcuda_wrap")], check=True)
        # editable installs import gpuslice/ from the source tree
        targets = [ROOT / "gpuslice" / "_native"]
        if not getattr(self, "editable_mode", False):
            targets.append(Path(self.build_lib) / "gpuslice" / "_native")
        for target in targets:
            for part in NATIVE_PARTS:
                src = ROOT / "libcuda_wrap" / "build" / part
                dst = target / part
                if dst.exists():
                    shutil.rmtree(dst)
                shutil.copytree(src, dst)


setup(cmdclass={"build_py": BuildWithNative})

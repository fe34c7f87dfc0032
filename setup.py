"""Build hook: compile the C parts (make -C libcuda_wrap) and ship them inside
the package (gpuslice/_native/), so installed code finds them beside itself."""

import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
NATIVE_PARTS = ("sim", "ledger", "wrap", "tools", "bin")


class BuildWithNative(build_py):
    def run(self) -> None:
        super().run()
        subprocess.run(["make", "-C", str(ROOT / "libcuda_wrap")], check=True)
        built = ROOT / "libcuda_wrap" / "build"
        if getattr(self, "editable_mode", False):
            # editable installs import gpuslice/ from the source tree: link the
            # build directory, so a later `make` is seen without reinstalling
            link = ROOT / "gpuslice" / "_native"
            if link.is_symlink() or link.is_file():
                link.unlink()
            elif link.exists():
                shutil.rmtree(link)
            link.symlink_to(Path("..") / "libcuda_wrap" / "build", target_is_directory=True)
            return
        native = Path(self.build_lib) / "gpuslice" / "_native"
        if native.exists():  # a stale build/ must not leak other parts into the wheel
            shutil.rmtree(native)
        for part in NATIVE_PARTS:
            shutil.copytree(built / part, native / part)


setup(cmdclass={"build_py": BuildWithNative})

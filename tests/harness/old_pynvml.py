"""A Python that sees the project's environment but the oldest nvidia-ml-py
pyproject.toml admits: what a node that kept its own older pynvml runs.
Made once under build/ (pip fetches the wheel from PyPI the first time)."""

from __future__ import annotations

import re
import site
import subprocess
import sys
from pathlib import Path

import tomllib

from tests.harness import REPO


def minimum() -> str:
    """The lowest nvidia-ml-py release pyproject.toml admits (its `>=` bound)."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if d.startswith("nvidia-ml-py"))
    m = re.fullmatch(r"nvidia-ml-py>=([0-9]+\.[0-9]+\.[0-9]+)", spec.replace(" ", ""))
    assert m, f"nvidia-ml-py's pin {spec!r} is not one >= bound naming a release"
    return m.group(1)


def python_with_oldest() -> tuple[str, str]:
    """(python, version): a venv with the oldest admitted nvidia-ml-py first on
    its path, then this environment's packages (gpuslice, the simulator, grpc)."""
    version = minimum()
    venv = REPO / "build" / f"venv-nvidia-ml-py-{version}"
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", f"nvidia-ml-py=={version}"], check=True, timeout=300)
        purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        # addsitedir, not a plain path: this environment's .pth files (the editable installs) apply too
        lines = "".join(f"import site; site.addsitedir({d!r})\n" for d in site.getsitepackages())
        (Path(purelib) / "zz-project-env.pth").write_text(lines)
    return str(py), version

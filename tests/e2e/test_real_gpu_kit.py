"""The real-GPU kit as it is used on a GPU machine, here on the simulator:
prepare.sh fetches the wheels (with network), run.sh installs gpuslice from
them alone (pip --no-index) into a venv of its own, builds the C parts, and
runs every step; the tree and the wheels fit what the device tool carries."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.harness import REPO
from tests.harness.machine import needs_root

pytestmark = needs_root
KIT = REPO / "tools" / "real-gpu"
CARRY_LIMIT = 40 << 20  # the bound for the source tree plus the wheels


def wheels() -> Path:
    """This Python's wheels, fetched once and kept under build/ (prepare.sh skips nothing itself)."""
    version = ".".join(platform.python_version_tuple()[:2])
    where = REPO / "build" / f"real-gpu-wheels-{version}"
    if not any(where.glob("grpcio-*.whl")):
        env = {**os.environ, "PYVER": version, "WHEELS": str(where), "PYTHON": str(REPO / ".venv/bin/python")}
        r = subprocess.run(["sh", str(KIT / "prepare.sh")], env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
    return where


def memory_lines(log: Path) -> str:
    """The daemon's lines about what the driver held beyond the slices' charges: a failed memory
    row's cause (a fresh CI machine's selftest once read one context too many, not seen here)."""
    if not log.exists():
        return ""
    lines = [x for x in log.read_text().splitlines() if "driver-side" in x or "unsliced" in x or "exited;" in x]
    return "\n-- daemon.log, memory:\n" + "\n".join(lines[-60:])


def tree_size() -> int:
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True).stdout
    return sum((REPO / f).stat().st_size for f in files.decode().split("\0") if f and (REPO / f).is_file())


@pytest.mark.measure  # its selftest step measures the compute shares: last, beside measuring tests only, under xdist
def test_prepare_then_run_installs_from_the_wheels_alone_and_passes_on_the_simulator(tmp_path):
    """Run from the repository root, as docs/real-gpu.md says: on the H200 `python -m gpuslice.cli`
    found the source tree's gpuslice/ there before the installed package."""
    found = wheels()
    size = sum(p.stat().st_size for p in found.iterdir())
    assert size + tree_size() < CARRY_LIMIT, f"{size >> 20} MiB of wheels"
    work = Path(tempfile.mkdtemp(prefix="gskit-", dir="/tmp"))
    env = {**os.environ, "OUT": str(tmp_path / "out"), "GPUSLICE_KIT_STATE": str(tmp_path / "kit"),
           "GPUSLICE_KIT_DIR": str(work), "WHEELS": str(found)}  # fmt: skip
    env.pop("VIRTUAL_ENV", None)
    try:
        r = subprocess.run(
            ["sh", str(KIT / "run.sh"), "--sim"], env=env, capture_output=True, text=True, timeout=900, cwd=REPO
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:] + memory_lines(tmp_path / "out" / "daemon.log")
    assert "installing gpuslice and the simulator" in r.stdout
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["summary"]["FAIL"] == 0 and report["summary"]["PASS"] >= 30 and report["pending"] == []
    venv = tmp_path / "kit" / "venv"
    assert (venv / "bin" / "gpuslice").exists()  # its own install, from the wheels (pip --no-index)
    log = (tmp_path / "out" / "kit.log").read_text()
    assert "selftest: " in log and re.search(r"\d+ steps done, 0 checks failed", log)
    commit = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty", "--abbrev=12"],
                            capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert report["machine"]["gpuslice"] == f"{importlib.metadata.version('gpuslice')} ({commit})"

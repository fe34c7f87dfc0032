"""Packaging, layout and the command line."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import click
from click.testing import CliRunner

from gpuslice import __version__
from gpuslice.cli.main import main
from tests.harness import REPO

ROOT = REPO


def walk(cmd: click.Command, path: tuple[str, ...] = ()):
    yield path
    if isinstance(cmd, click.Group):
        for name, sub in cmd.commands.items():
            yield from walk(sub, (*path, name))


def test_help_on_every_subcommand_and_version():
    runner = CliRunner()
    paths = list(walk(main))
    assert ("sim", "check") in paths and ("demo",) in paths
    for path in paths:
        r = runner.invoke(main, [*path, "--help"])
        assert r.exit_code == 0, (path, r.output)
        assert "Usage:" in r.output
    r = runner.invoke(main, ["--version"])
    assert r.exit_code == 0 and __version__ in r.output


def test_wheel_maps_components_into_one_package_with_the_libraries(tmp_path):
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp_path, ROOT], capture_output=True, text=True
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("gpuslice-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"gpuslice", next(t for t in tops if t.endswith(".dist-info"))}
    for part in ("allocator", "cdi", "cli", "dra"):
        assert f"gpuslice/{part}/__init__.py" in names
    assert not [n for n in names if n.startswith(("gpuslice/bench/", "gpuslice/hook/", "gpuslice/runtime_shim/"))]
    assert not [n for n in names if "harness" in n or "/tests/" in n]  # the test harness is not shipped
    assert "gpuslice/csrc/gpuslice_constants.h" in names  # read by gpuslice.constants
    for lib in ("libcuda.so.1", "libnvidia-ml.so.1", "gpuslice-sim.yaml"):
        assert f"gpuslice/_native/sim/{lib}" in names
    for part in ("ledger/libgpuslice-ledger.so", "ledger/gpuslice_slice.h"):
        assert f"gpuslice/_native/{part}" in names
    assert "gpuslice/proto/gpuslice_pb2_grpc.py" in names and "gpuslice/proto/gpuslice.proto" in names
    # installed elsewhere, the code finds the libraries beside itself
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target, wheel], check=True)
    r = subprocess.run(
        [sys.executable, "-c", "from gpuslice.sim import libs; print(libs().cuda)"],
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(target / "gpuslice/_native/sim/libcuda.so.1")


def test_c_code_builds_on_its_own(tmp_path):
    r = subprocess.run(["make", "-C", ROOT / "libcuda_wrap", f"BUILD={tmp_path}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "sim/libcuda.so.1").exists() and (tmp_path / "sim/libnvidia-ml.so.1").exists()


def test_demo_runs_workloads_on_a_shared_simulated_gpu():
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuslice.cli",
            "demo",
            "--mode",
            "processes",
            "--workers",
            "2",
            "--alloc-mib",
            "1024",
            "--seconds",
            "1.5",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("copy round trip ok") == 2
    assert "2.0 GiB / 40.0 GiB" in r.stdout  # both processes' memory on GPU 0

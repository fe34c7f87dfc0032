"""Packaging, layout and the command line."""

from __future__ import annotations

import functools
import os
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
        ctx = click.Context(cmd)
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            assert sub is not None and sub.name == name, (path, name)  # the lazy table names each command right
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


def wheel(source, out):
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", out, source], capture_output=True, text=True
    )
    assert built.returncode == 0, built.stderr
    (found,) = out.glob("*.whl")
    return found


def test_wheel_maps_components_into_one_package_with_the_libraries(tmp_path):
    node = wheel(ROOT, tmp_path / "node")
    names = zipfile.ZipFile(node).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"gpuslice", next(t for t in tops if t.endswith(".dist-info"))}
    for part in ("allocator", "cdi", "cli", "dra", "device_plugin"):
        assert f"gpuslice/{part}/__init__.py" in names
    assert not [n for n in names if n.startswith(("gpuslice/bench/", "gpuslice/hook/", "gpuslice/runtime_shim/"))]
    assert not [n for n in names if "harness" in n or "/tests/" in n]  # the test harness is not shipped
    assert "gpuslice/csrc/gpuslice_constants.h" in names  # read by gpuslice.constants
    for part in ("ledger/libgpuslice-ledger.so", "ledger/gpuslice_slice.h", "wrap/libcuda.so.1", "bin/gpuslice-hook"):
        assert f"gpuslice/_native/{part}" in names
    # the simulator is its own distribution: the node's only libcuda is the interposer
    assert [n for n in names if "libcuda.so" in n] == ["gpuslice/_native/wrap/libcuda.so.1"]
    assert not [n for n in names if "/sim/" in n or "gpuslice-sim.yaml" in n]
    assert "gpuslice/proto/gpuslice_pb2_grpc.py" in names and "gpuslice/proto/gpuslice.proto" in names

    sim = wheel(ROOT / "sim", tmp_path / "sim")
    assert sim.name.startswith(f"gpuslice_sim-{__version__}-")
    sim_names = zipfile.ZipFile(sim).namelist()
    for lib in ("libcuda.so.1", "libnvidia-ml.so.1", "gpuslice-sim.yaml"):
        assert f"gpuslice_sim/_native/{lib}" in sim_names
    # installed elsewhere, each finds its libraries beside itself; without
    # gpuslice-sim, what needs the simulator says in one line what to install
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target]
    subprocess.run([*pip, node], check=True)
    # -S: the checkout's editable installs (.pth finders in site-packages) stay out
    deps = os.pathsep.join(p for p in sys.path if p.endswith("site-packages"))
    env = {"PYTHONPATH": f"{target}{os.pathsep}{deps}", "PATH": "/usr/bin:/bin"}
    run = functools.partial(subprocess.run, env=env, cwd=tmp_path, capture_output=True, text=True)
    r = run([sys.executable, "-S", "-m", "gpuslice.cli", "sim", "check"])
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "install the gpuslice-sim package" in r.stderr
    subprocess.run([*pip, sim], check=True)
    r = run([sys.executable, "-S", "-c", "from gpuslice_sim import libs; print(libs().cuda)"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(target / "gpuslice_sim/_native/libcuda.so.1")
    r = run([sys.executable, "-S", "-m", "gpuslice.cli", "sim", "check"])
    assert r.returncode == 0 and r.stdout.startswith("ok: "), r.stderr


def test_c_code_builds_on_its_own(tmp_path):
    r = subprocess.run(["make", "-C", ROOT, f"BUILD={tmp_path}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for built in ("sim/libcuda.so.1", "sim/libnvidia-ml.so.1", "wrap/libcuda.so.1", "ledger/libgpuslice-ledger.so",
                  "tools/gpuslice-selftest-worker", "bin/gpuslice-hook", "bin/gpuslice-runtime"):  # fmt: skip
        assert (tmp_path / built).exists(), built
    # the node's parts alone build nothing of the simulator
    node = tmp_path / "node"
    r = subprocess.run(["make", "-C", ROOT, f"BUILD={node}", "node"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in node.iterdir()) == ["bin", "ledger", "tools", "wrap"]


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

"""Docker, as its users run it: `docker run --runtime gpuslice` with the
request in environment variables on Debian 12's Docker 20.10 (which puts no
annotations into the OCI spec), and on Debian 13's Docker 26 also with
`--annotation` and a CDI device (`--device gpuslice.io/gpu=0`, features.cdi),
each engine configured by `gpuslice install docker`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslice.cli import rootfs
from tests.harness.debian import unpacked
from tests.harness.docker import IMAGE, DockerNode
from tests.harness.gpu_node import GpuNode
from tests.harness.gpu_node import gpu_node as sim_gpu_node

GiB, MiB = 1 << 30, 1 << 20
SPEC_PATH = Path("/var/run/cdi/gpuslice-docker.json")
# Docker 20.10: Debian 12's, the system's; 26: Debian 13's, unpacked beside it
ENGINES = {"20.10": None, "26": "trixie"}

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0
    or not all(Path(p).exists() for p in ("/usr/sbin/dockerd", "/usr/bin/docker"))
    or not shutil.which("runc"),
    reason="needs root, docker.io and runc (./dev.sh installs them as root)",
)


def engine_bins(engine: str) -> list[Path]:
    suite = ENGINES[engine]
    if suite is None:
        return [Path("/usr/sbin"), Path("/usr/bin")]  # ahead of any other docker client on PATH
    tree = unpacked(("docker.io", "docker-cli"), suite)
    return [tree / "usr/sbin", tree / "usr/bin"]


@pytest.fixture(scope="module")
def gpu_node(tmp_path_factory) -> Iterator[GpuNode]:
    with sim_gpu_node(tmp_path_factory.mktemp("daemon"), SPEC_PATH) as node:
        yield node


@pytest.fixture(scope="module", params=sorted(ENGINES))
def engine(request, gpu_node, tmp_path_factory) -> Iterator[DockerNode]:
    work = tmp_path_factory.mktemp(f"docker-{request.param}")
    node = DockerNode(engine_bins(request.param), work, gpu_node.shim, rootfs.build(work / "rootfs"))
    installed = node.install()
    assert installed.returncode == 0, installed.stderr
    try:
        node.start()
        node.import_image()
        yield node
    finally:
        node.cleanup()


def probe(r: subprocess.CompletedProcess) -> dict:
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def run(engine: DockerNode, *args: str, command: tuple[str, ...] = (rootfs.PROBE,)) -> subprocess.CompletedProcess:
    return engine.docker("run", "--rm", "--network", "none", *args, IMAGE, *command)


def test_install_wrote_the_runtime_and_cdi_where_the_engine_has_it(engine):
    config = json.loads(engine.daemon_json.read_text())
    assert config["runtimes"]["gpuslice"] == {"path": str(engine.shim)}
    has_cdi = engine.server_version() >= (25, 0)
    assert config.get("features", {}).get("cdi", False) is has_cdi
    info = json.loads(engine.docker("info", "--format", "{{json .Runtimes}}").stdout)
    assert "gpuslice" in info and "runc" in info


def test_environment_variables_reach_the_shim(engine, gpu_node):
    r = run(engine, "--runtime", "gpuslice", "-e", "GPUSLICE_MEMORY=1Gi", "-e", "GPUSLICE_CORES=25")
    out = probe(r)
    assert out["total"] == GiB and out["allocated"] == GiB and out["then"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert gpu_node.wait_slices(0) == []


def test_a_bad_environment_value_fails_the_run_with_one_line_and_reserves_nothing(engine, gpu_node):
    r = run(engine, "--runtime", "gpuslice", "-e", "GPUSLICE_CORES=150")
    assert r.returncode != 0
    assert 'environment variable GPUSLICE_CORES: "150" is not valid; accepted: a whole number' in r.stderr, r.stderr
    assert gpu_node.slices() == []


def test_annotations_reach_the_shim_and_win_over_the_environment(engine, gpu_node):
    if engine.server_version() < (24, 0):
        r = run(engine, "--runtime", "gpuslice", "--annotation", "gpuslice.io/memory=2Gi")
        assert r.returncode != 0 and "--annotation" in r.stderr  # 20.10's client has no such flag
        return
    r = run(engine, "--runtime", "gpuslice", "--annotation", "gpuslice.io/memory=2Gi", "-e", "GPUSLICE_MEMORY=5Gi")
    out = probe(r)
    assert out["total"] == 2 * GiB and out["then"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert gpu_node.wait_slices(0) == []


def test_a_cdi_device_with_the_default_runtime(engine, gpu_node):
    if engine.server_version() < (25, 0):
        r = run(engine, "--device", "gpuslice.io/gpu=0", "-e", "GPUSLICE_MEMORY=1Gi")
        assert r.returncode != 0  # 20.10 takes --device as a path on the host: there is none
        assert gpu_node.slices() == []
        return
    r = run(engine, "--device", "gpuslice.io/gpu=0", "--annotation", "gpuslice.io/memory=1500Mi")
    out = probe(r)
    assert out["total"] == 1500 * MiB and out["then"] == "CUDA_ERROR_OUT_OF_MEMORY"
    r = run(engine, "--device", "gpuslice.io/gpu=0", "-e", "GPUSLICE_MEMORY=768Mi")
    assert probe(r)["total"] == 768 * MiB
    assert gpu_node.wait_slices(0) == []

"""Driver-enforced memory limits (nvmlDeviceSetMemoryLimits_v1) in real
containers on the simulator: a program that bypasses the interposer is still
held to its slice where the driver offers the limits, and only the interposer
holds programs where it does not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from gpuslice.cli import rootfs
from tests.harness.machine import GiB, gpu
from tests.harness.podman_node import PODMAN, SPEC_PATH, Node, needs_runtimes, podman_detached, probe_result

pytestmark = needs_runtimes
BYPASS = ["--env", "GPUSLICE_PROBE_LIBCUDA=/usr/lib/gpuslice/driver/libcuda.so.1"]


@pytest.fixture
def make_node(daemon, tmp_path):
    made = []

    def make(supported: bool) -> Node:
        n = Node(daemon, tmp_path, gpus=[gpu("16Gi", memory_limits="true" if supported else "false")])
        made.append(n)
        return n

    yield make
    SPEC_PATH.unlink(missing_ok=True)


def run_probe(root_fs, extra: list[str]) -> dict:
    r = subprocess.run(
        ["podman", "run", "--rm", *PODMAN, "--device", "gpuslice.io/gpu=0", "--annotation",
         "gpuslice.io/memory=1Gi", *extra, "--rootfs", str(root_fs), rootfs.PROBE, "256"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return probe_result(r)


def test_with_driver_limits_a_bypassing_program_still_stops_at_the_slice(make_node, root_fs):
    make_node(True)
    bypass = run_probe(root_fs, BYPASS)
    assert bypass["total"] == GiB and bypass["allocated"] == GiB and bypass["then"] == "CUDA_ERROR_OUT_OF_MEMORY"
    wrapped = run_probe(root_fs, [])
    assert wrapped["total"] == GiB and wrapped["allocated"] == GiB


def test_without_driver_limits_only_the_interposer_holds(make_node, root_fs):
    make_node(False)
    bypass = run_probe(root_fs, BYPASS)
    assert bypass["allocated"] > GiB  # nothing stops a program that skips the interposer
    wrapped = run_probe(root_fs, [])
    assert wrapped["total"] == GiB and wrapped["allocated"] == GiB and wrapped["then"] == "CUDA_ERROR_OUT_OF_MEMORY"


# podman exec does not carry the CDI spec's environment: the simulator's own
SIM_ENV = ["--env", "GPUSLICE_SIM_CONFIG=/etc/gpuslice/sim.yaml", "--env", "GPUSLICE_SIM_STATE_DIR=/run/gpuslice/sim"]


def _exec_probe(name: str, extra: list[str]) -> dict:
    r = subprocess.run(
        ["podman", "exec", *SIM_ENV, *extra, name, rootfs.PROBE, "256"], capture_output=True, text=True, timeout=60
    )
    return probe_result(r)


@pytest.mark.parametrize("supported", [True, False])
def test_status_resize_and_daemon_restart(make_node, root_fs, daemon, supported):
    node = make_node(supported)
    name = f"gpuslice-limits-{os.getpid()}-{int(supported)}"
    podman_detached(name, root_fs, 120)
    try:
        (s,) = node.client.list()
        assert s.enforcement == ("driver+interposer" if supported else "interposer")
        table = subprocess.run(
            [sys.executable, "-m", "gpuslice.cli", "status", "--socket", str(node.d.socket)],
            capture_output=True,
            text=True,
        ).stdout
        assert table.rstrip().endswith("driver+interposer" if supported else "elastic  interposer")
        cid = s.container_id
        node.client.resize(cid, {"gpuslice.io/memory": "2Gi"})
        bypass = _exec_probe(name, BYPASS)
        assert bypass["total"] == (2 * GiB if supported else 16 * GiB)
        if supported:
            assert bypass["allocated"] == 2 * GiB
        # kill -9 the daemon; the limits stay in force and match the ledger after a restart
        node.d.kill()
        node.d = daemon.restart(node.d)
        node.client = node.d.client()
        (s,) = node.client.list()
        assert s.gpus[0].memory_limit == 2 * GiB
        assert s.enforcement == ("driver+interposer" if supported else "interposer")
        if supported:
            assert _exec_probe(name, BYPASS)["total"] == 2 * GiB
    finally:
        subprocess.run(["podman", "rm", "-f", name], capture_output=True, timeout=60)
    deadline = time.monotonic() + 10
    while node.client.list() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert node.client.list() == []


LIMITS = r"""
import os, sys, json, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
ns = sys.argv[1].encode()

def get():
    q = pynvml.c_nvmlGetMemoryLimits_v1_t(nameSpace=ns)
    try:
        pynvml.nvmlDeviceGetMemoryLimits_v1(h, q)
        return [q.softLimit, q.hardLimit]
    except pynvml.NVMLError as e:
        return type(e).__name__

out = {}
lim = pynvml.c_nvmlSetMemoryLimits_v1_t(nameSpace=ns, softLimit=1 << 29, hardLimit=1 << 30)
pynvml.nvmlDeviceSetMemoryLimits_v1(h, lim)
out["set"] = get()
os.rmdir(sys.argv[1])
out["removed"] = get()
os.mkdir(sys.argv[1])
out["recreated"] = get()
try:
    bad = pynvml.c_nvmlSetMemoryLimits_v1_t(nameSpace=ns, softLimit=1 << 31, hardLimit=1 << 30)
    pynvml.nvmlDeviceSetMemoryLimits_v1(h, bad)
except pynvml.NVMLError as e:
    out["soft_above_hard"] = type(e).__name__
print(json.dumps(out))
"""


def test_simulated_limits_follow_nvml_semantics(make_machine):
    from gpuslice.allocator.driver_limits import unified_mount

    mount = unified_mount()
    if mount is None:
        pytest.skip("no cgroup v2 hierarchy mounted")
    cg = mount / f"gpuslice-test-{os.getpid()}"
    cg.mkdir()
    try:
        m = make_machine([gpu("4Gi")])
        r = subprocess.run([sys.executable, "-c", LIMITS, str(cg)], env=m.env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["set"] == [1 << 29, 1 << 30]
        assert out["removed"] == "NVMLError_OperatingSystem"  # the cgroup path is gone
        assert out["recreated"] == "NVMLError_NotFound"  # and its limit went with it
        assert out["soft_above_hard"] == "NVMLError_InvalidArgument"
    finally:
        if cg.exists():
            cg.rmdir()
    off = make_machine([gpu("4Gi", memory_limits="false")])
    r = subprocess.run([sys.executable, "-c", LIMITS, str(mount)], env=off.env, capture_output=True, text=True)
    assert "NVMLError_NotSupported" in r.stderr  # older drivers

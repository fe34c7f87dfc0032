"""The device plugin end to end on containerd 1.7 (Debian 13's, CDI in its
CRI): a stand-in kubelet device manager (its own process, the kubelet's own
protos) admits pods through `gpuslice device-plugin`, and the kubelet-like CRI
client creates each container with what the kubelet would pass: the CDI
devices and env of the Allocate answers it kept. Inside, the CUDA probe and
the load generator run through the interposer on the simulated GPUs. Real
containerd, runc, the hook and the daemon; nothing else is mocked."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslice.cli import rootfs
from gpuslice.proto import gpuslice_pb2 as pb
from tests.clients.cri import Kubelet
from tests.e2e.test_dra_containerd import share_of
from tests.harness.containerd import NEEDS_CRI, Pod, cdi_kubelet
from tests.harness.device_plugin import DevicePluginNode, pod
from tests.harness.gpu_node import GpuNode
from tests.harness.gpu_node import gpu_node as sim_gpu_node

GiB = 1 << 30
SPEC_PATH = Path("/var/run/cdi/gpuslice-dp.json")

pytestmark = NEEDS_CRI


@pytest.fixture(scope="module")
def gpu_node(tmp_path_factory) -> Iterator[GpuNode]:
    with sim_gpu_node(tmp_path_factory.mktemp("daemon"), SPEC_PATH, gpus=2) as node:
        yield node


@pytest.fixture(scope="module")
def cri(gpu_node, tmp_path_factory) -> Iterator[Kubelet]:
    with cdi_kubelet(tmp_path_factory, gpu_node.shim) as client:
        yield client


@pytest.fixture
def node(gpu_node, tmp_path) -> Iterator[DevicePluginNode]:
    n = DevicePluginNode.running(gpu_node.daemon, tmp_path)
    yield n
    n.close()
    for s in gpu_node.slices():
        gpu_node.daemon.client().release(s.container_id)


def gpu_of(node: DevicePluginNode, p: dict) -> str:
    """The GPU of the pod's first container, from the CDI device its answers name."""
    return node.options(p)["cdi_devices"][0].split("=", 1)[1]


def fill_gpu_1(node: DevicePluginNode) -> dict:
    """A pod holding all of GPU 1's memory: the probe reads CUDA device 0 (the
    simulator shows a container every GPU), so the pods under test go there."""
    index_of = {g.uuid: g.index for g in node.d.client().inventory().gpus}
    first = pod("filler-1", {"memory": 16})
    assert node.admit(first)["admitted"]
    if index_of[gpu_of(node, first)] == 1:
        return first
    second = pod("filler-2", {"memory": 16})
    assert node.admit(second)["admitted"] and index_of[gpu_of(node, second)] == 1
    node.delete(first)
    deadline = time.monotonic() + 15
    while len(node.allocations()) != 1:
        assert time.monotonic() < deadline, node.log()
        time.sleep(0.1)
    return second


def containers(cri: Kubelet, node: DevicePluginNode, p: dict, tmp: Path, env: dict[str, str]) -> tuple[Pod, dict]:
    sandbox = Pod(cri, tmp / "logs", p["metadata"]["name"], {}, handler="")  # the default runc: CDI does it all
    opts = node.options(p)
    return sandbox, {"cdi_devices": opts["cdi_devices"], "env": {**opts["envs"], **env}}


def test_two_pods_get_exactly_their_memory_and_hard_shares_and_deletion_frees_them(cri, node, gpu_node, tmp_path):
    fill_gpu_1(node)
    a, b = pod("a", {"memory": 4, "cores": 30}), pod("b", {"memory": 6, "cores": 60})
    assert node.admit(a)["admitted"] and node.admit(b)["admitted"]
    hard = {"GPUSLICE_COMPUTE_POLICY": "hard"}  # the container's own env (pod annotations work the same)
    pa, ka = containers(cri, node, a, tmp_path, hard)
    pb_, kb = containers(cri, node, b, tmp_path, hard)
    try:
        pa.run("probe", **ka)
        pb_.run("probe", **kb)
        for sandbox, size in ((pa, 4), (pb_, 6)):
            out = sandbox.probe("probe")
            assert out["total"] == size * GiB and out["allocated"] == size * GiB, out
            assert out["then"] == "CUDA_ERROR_OUT_OF_MEMORY", out
        la = pa.run("load", [rootfs.LOAD, "8", "100"], **ka)
        lb = pb_.run("load", [rootfs.LOAD, "8", "100"], **kb)
        used_a, used_b = share_of(pa, "load", 8), share_of(pb_, "load", 8)
        print(f"device plugin pods, hard 30 % and 60 % on one GPU: {used_a:.1f} % and {used_b:.1f} %")
        assert abs(used_a - 30) <= 1.0 and abs(used_b - 60) <= 1.0
        assert not {la, lb} & {s.container_id for s in gpu_node.wait_slices(5)}  # they left their ledgers
        # a restarted container (the same answers again, no Allocate) holds the same slice as its first run
        first, again, other = pa.run("hold-first", **ka), pa.run("hold-again", **ka), pb_.run("hold", **kb)
        held = {s.container_id: s for s in gpu_node.slices()}
        assert held[first].member_of and held[again].member_of == held[first].member_of != held[other].member_of
    finally:
        pa.close()
        pb_.close()
    node.delete(a)
    node.delete(b)
    deadline = time.monotonic() + 10
    while len(node.allocations()) != 1:  # the filler's
        assert time.monotonic() < deadline, node.log()
        time.sleep(0.1)
    assert [s.owner_kind for s in gpu_node.slices()] == [pb.DEVICES]  # members and groups went with their containers

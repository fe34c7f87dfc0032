"""DRA end to end on containerd 1.7 (Debian 13's, CDI in its CRI): the
kubelet plugin prepares claims exactly as kube-scheduler allocated them (a
stand-in kubelet over the kubelet's own protos, a stand-in API server), the
kubelet-like CRI client creates containers with the returned CDI device IDs,
and inside them the CUDA probe and load generator run through the interposer
on the simulated GPUs. Nothing else is mocked: real containerd, runc, the
hook, the daemon, and the plugin as `gpuslice kubelet-plugin`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslice.cli import rootfs
from tests.clients.cri import Kubelet, compile_api
from tests.harness.containerd import HOLD, Pod, containerd_bin, cri_node
from tests.harness.dra import DraNode, allocated
from tests.harness.gpu_node import GpuNode
from tests.harness.gpu_node import gpu_node as sim_gpu_node

GiB = 1 << 30
SPEC_PATH = Path("/var/run/cdi/gpuslice-dra.json")
CDI_DIR = Path("/var/run/cdi")  # where containerd looks, and the plugin writes each claim's spec
# The probe uses CUDA device 0. The simulator shows a container every GPU (a real
# driver shows only those whose device nodes CDI gave it), so claims the probe
# reads are on GPU 0.

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("containerd", "runc", "apt-get")),
    reason="needs root, containerd, runc and apt-get (./dev.sh installs them as root)",
)


@pytest.fixture(scope="module")
def gpu_node(tmp_path_factory) -> Iterator[GpuNode]:
    with sim_gpu_node(tmp_path_factory.mktemp("daemon"), SPEC_PATH, gpus=2) as node:
        yield node


@pytest.fixture(scope="module")
def kubelet(gpu_node, tmp_path_factory) -> Iterator[Kubelet]:
    """containerd 1.7 with the node's config plus `gpuslice install containerd` (enable_cdi)."""
    with cri_node(containerd_bin("1.7"), tmp_path_factory.mktemp("containerd-1.7"), gpu_node.shim,
                  rootfs.build(tmp_path_factory.mktemp("probe-rootfs")),
                  compile_api(tmp_path_factory.mktemp("cri-api"))) as (_, client):  # fmt: skip
        yield client


@pytest.fixture
def dra(gpu_node, tmp_path) -> Iterator[DraNode]:
    node = DraNode(gpu_node.daemon, SPEC_PATH, tmp_path, CDI_DIR)
    node.start_plugin()
    yield node
    node.close()
    for left in CDI_DIR.glob("gpuslice.io-claim_*.json"):
        left.unlink()
    for s in gpu_node.slices():
        gpu_node.daemon.client().release(s.container_id)


@pytest.fixture
def pods(kubelet, tmp_path):
    made: list[Pod] = []

    def make(name: str) -> Pod:
        pod = Pod(kubelet, tmp_path / "logs", name, {}, handler="")  # the default runc handler: CDI does it all
        made.append(pod)
        return pod

    yield make
    for pod in made:
        pod.close()


def prepared(dra: DraNode, *claims: dict) -> list[str]:
    for c in claims:
        dra.api.put_claim(c)
    answers = dra.prepare(*claims)
    ids = []
    for c in claims:
        answer = answers[c["metadata"]["uid"]]
        assert answer.get("error", "") == "", answer
        ids.append(answer["devices"][0]["cdi_device_ids"][0])
    return ids


def json_lines(pod: Pod, name: str) -> list[dict]:
    log = pod.logs / f"{name}.log"
    lines = [line.split(" ", 3)[-1] for line in log.read_text().splitlines()] if log.exists() else []
    return [json.loads(t) for t in lines if t.startswith("{")]


def share_of(pod: Pod, name: str, seconds: float) -> float:
    """The load generator's GPU share from its own exact accounting, after 2 s of settling."""
    deadline = time.monotonic() + seconds + 30
    while not any(r.get("done") for r in json_lines(pod, name)):
        assert time.monotonic() < deadline, json_lines(pod, name)[-3:]
        time.sleep(0.2)
    points = [(r["t"], r["busy"]) for r in json_lines(pod, name) if "busy" in r]
    (t0, b0), (t1, b1) = points[20], points[-1]  # from 2 s in, to the end
    return 100 * (b1 - b0) / (t1 - t0)


def test_a_claims_containers_get_exactly_its_memory_and_share_and_it_goes_away(dra, pods, gpu_node):
    config = [{"source": "FromClaim", "opaque": {"driver": "gpuslice.io", "parameters": {
        "apiVersion": "gpuslice.io/v1", "kind": "SliceConfig", "computePolicy": "hard"}}}]  # fmt: skip
    claim = allocated("train", ("gpu-0", "4Gi", "30"), config=config)
    [device] = prepared(dra, claim)
    pod = pods("train")
    probe = pod.run("probe", cdi_devices=[device])
    load = pod.run("load", [rootfs.LOAD, "7", "100"], cdi_devices=[device])
    out = pod.probe("probe")
    assert out["total"] == 4 * GiB and out["allocated"] == 4 * GiB and out["then"] == "CUDA_ERROR_OUT_OF_MEMORY"
    uid = claim["metadata"]["uid"]
    held = {s.container_id for s in gpu_node.slices()}
    assert held == {f"claim-{uid}", probe, load}  # the claim's slice, and its two containers in it
    used = share_of(pod, "load", 7)
    print(f"a hard 30 % claim's container: {used:.1f} %")
    assert abs(used - 30) <= 3
    pod.close()
    assert {s.container_id for s in gpu_node.wait_slices(1)} == {f"claim-{uid}"}  # the containers left it
    assert dra.unprepare(claim)[uid] == {"error": ""}
    assert gpu_node.wait_slices(0) == [] and not (CDI_DIR / f"gpuslice.io-claim_{uid}.json").exists()


def test_two_containers_of_one_claim_share_its_memory(dra, pods, gpu_node):
    claim = allocated("shared", ("gpu-0", "3Gi", None))
    [device] = prepared(dra, claim)
    pod = pods("shared")
    holding = [rootfs.PROBE, "64", "600"]  # allocates to the limit, then keeps it
    pod.run("first", holding, cdi_devices=[device])
    first = pod.probe("first")
    pod.run("second", holding, cdi_devices=[device])
    second = pod.probe("second")
    assert first["total"] == second["total"] == 3 * GiB
    assert first["allocated"] + second["allocated"] == 3 * GiB  # one ledger: the first holds what it took
    pod.close()
    dra.unprepare(claim)


def test_two_claims_on_one_gpu_and_a_two_gpu_claim(dra, pods, gpu_node):
    small, large = allocated("small", ("gpu-0", "1Gi", "20")), allocated("large", ("gpu-0", "5Gi", "40"))
    pair = allocated("pair", ("gpu-0", "2Gi", "20"), ("gpu-1", "2Gi", "20"))
    devices = prepared(dra, small, large, pair)
    pod = pods("three")
    for name, device in zip(("small", "large", "pair"), devices, strict=True):
        pod.run(name, cdi_devices=[device])
    totals = {name: pod.probe(name)["total"] for name in ("small", "large", "pair")}
    assert totals == {"small": 1 * GiB, "large": 5 * GiB, "pair": 2 * GiB}
    claim_slice = {s.container_id: s for s in gpu_node.slices()}[f"claim-{pair['metadata']['uid']}"]
    assert sorted(g.index for g in claim_slice.gpus) == [0, 1]
    pod.close()
    dra.unprepare(small, large, pair)
    assert gpu_node.wait_slices(0) == []


def test_a_plugin_restart_between_prepare_and_unprepare(dra, pods, gpu_node):
    claim = allocated("steady", ("gpu-0", "2Gi", None))
    [device] = prepared(dra, claim)
    pod = pods("steady")
    pod.run("app", HOLD, cdi_devices=[device])
    assert pod.probe("app")["total"] == 2 * GiB
    dra.stop_plugin(signal.SIGKILL)
    dra.start_plugin()
    pod.close()
    uid = claim["metadata"]["uid"]
    assert dra.unprepare(claim)[uid] == {"error": ""}
    assert gpu_node.wait_slices(0) == [] and not (CDI_DIR / f"gpuslice.io-claim_{uid}.json").exists()


def test_a_claim_the_gpu_cannot_hold_reserves_nothing(dra, gpu_node):
    claim = allocated("huge", ("gpu-0", "20Gi", None))
    dra.api.put_claim(claim)
    error = dra.prepare(claim)[claim["metadata"]["uid"]]["error"]
    assert error == "claim ml/huge: request needs 20.0 GiB per GPU, more than any GPU holds"
    assert gpu_node.slices() == [] and not list(CDI_DIR.glob("gpuslice.io-claim_*.json"))

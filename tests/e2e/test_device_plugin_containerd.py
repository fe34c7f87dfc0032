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
from tests.harness.device_plugin import NODE, DevicePluginNode, pod
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


@pytest.mark.measure  # a share measured over seconds: last, beside measuring tests only, under xdist
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
        la = pa.run("load", [rootfs.LOAD, "10", "100"], **ka)
        lb = pb_.run("load", [rootfs.LOAD, "10", "100"], **kb)
        # on the H100's NVML (the simulator's default) the daemon first fits the two slices' costs
        settled = gpu_node.daemon.client().compute_settled([la, lb], 8)
        assert settled is not None
        since = settled + 500_000_000
        used_a, used_b = share_of(pa, "load", 10, since), share_of(pb_, "load", 10, since)
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


def test_a_hami_pods_gpu_constraint_is_held_by_the_plugin_and_at_the_containers_start(cri, node, gpu_node, tmp_path):
    """HAMi's nouse-gpuuuid, rewritten by the webhook into the container's
    GPUSLICE_AVOID_DEVICE: the plugin gives its memory on the other GPU though
    binpacking would choose the avoided one (a pod pinned there holds a
    little of it), and its container runs there through containerd; the same
    devices in a container whose own choice rules their GPU out do not start."""
    import base64
    import copy
    import json

    import grpc
    import jsonpatch

    from gpuslice.admission.review import Settings, answer

    uuid_of = {g.index: g.uuid for g in node.d.client().inventory().gpus}
    filler = pod("pinned-to-1", {"memory": 2}, env={"GPUSLICE_DEVICE": "1"})
    assert node.admit(filler)["admitted"] and gpu_of(node, filler) == uuid_of[1]  # the fuller GPU now
    hami_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hami-avoid", "namespace": "default",
                "annotations": {"nvidia.com/nouse-gpuuuid": uuid_of[1]}}, "spec": {"containers": [{
                    "name": "cuda", "image": "busybox",
                    "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4096}}}]}}  # fmt: skip
    review = {"request": {"uid": "r2", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
                          "object": hami_pod}}  # fmt: skip
    got = answer(review, Settings("devicePlugin"))["response"]
    assert got["allowed"], got
    p = as_the_api_server_stores_it(
        jsonpatch.apply_patch(copy.deepcopy(hami_pod), json.loads(base64.b64decode(got["patch"])))
    )
    p["metadata"]["uid"] = "7d3e2c1a-0000-4000-8000-00000000e2e1"
    env = {e["name"]: e["value"] for e in p["spec"]["containers"][0]["env"]}
    assert env == {"GPUSLICE_AVOID_DEVICE": uuid_of[1]}
    assert node.admit(p)["admitted"], node.log()
    opts = node.options(p, container="cuda")
    assert opts["cdi_devices"] == [f"gpuslice.io/gpu={uuid_of[0]}"]
    sandbox = Pod(cri, tmp_path / "logs", "hami-avoid", {}, handler="")
    kw = {"cdi_devices": opts["cdi_devices"], "env": {**opts["envs"], **env}}
    try:
        sandbox.run("probe", **kw)
        out = sandbox.probe("probe")
        assert out["total"] == 4096 << 20 and out["then"] == "CUDA_ERROR_OUT_OF_MEMORY", out
        with pytest.raises(grpc.RpcError) as e:
            sandbox.run("elsewhere", **{**kw, "env": {**kw["env"], "GPUSLICE_AVOID_DEVICE": "0"}})
        said = e.value.details()
        assert f"the device plugin gave it GPU 0 ({uuid_of[0]}), one of gpuslice.io/avoid-device 0" in said, said
    finally:
        sandbox.close()
    node.delete(p)
    node.delete(filler)


def test_a_pod_asking_two_whole_gpus_runs_on_both(cri, node, gpu_node, tmp_path):
    """gpuslice.io/gpu: 2 (the kubelet refused such a pod at admission before stop 76: the plugin's
    preferred allocation said all units must lie on one GPU): admitted with both GPUs, its
    container starts through containerd with both CDI devices, joins one share group of both
    whole-GPU allocations, and its CUDA probe has a whole GPU."""
    p = pod("two-whole", {"gpu": 2})
    assert node.admit(p) == {"admitted": True}, node.log()
    opts = node.options(p)
    uuids = {g.uuid: g for g in node.d.client().inventory().gpus}
    assert sorted(d.split("=", 1)[1] for d in opts["cdi_devices"]) == sorted(uuids)
    sandbox = Pod(cri, tmp_path / "logs", "two-whole", {}, handler="")
    try:
        cid = sandbox.run("probe", cdi_devices=opts["cdi_devices"], env=opts["envs"])
        out = sandbox.probe("probe")
        assert out["total"] == next(iter(uuids.values())).memory_total, out
        held = {s.container_id: s for s in gpu_node.slices()}
        group = held[held[cid].member_of]  # one share group of the two whole-GPU allocations
        assert group.owner_kind == pb.SHARE_GROUP and sorted(g.uuid for g in group.gpus) == sorted(uuids), held
    finally:
        sandbox.close()
    node.delete(p)


def as_the_api_server_stores_it(p: dict) -> dict:
    """A pod as kube-apiserver stores it once created and bound: an extended
    resource's request defaulted to its limit (SetDefaults for a container's
    ResourceRequirements), a uid, its node, Pending."""
    for c in p["spec"]["containers"]:
        limits = c.get("resources", {}).get("limits", {})
        c["resources"]["requests"] = {**limits, **c["resources"].get("requests", {})}
    p["metadata"]["uid"] = "7d3e2c1a-0000-4000-8000-00000000e2e0"
    p["spec"]["nodeName"] = NODE
    p["status"] = {"phase": "Pending"}
    return p


@pytest.mark.measure  # a share measured over seconds: last, beside measuring tests only, under xdist
def test_a_hami_pod_rewritten_by_the_webhook_gets_exactly_its_memory_and_its_hard_share(cri, node, gpu_node, tmp_path):
    """Issue 49 end to end: a pod written for HAMi (its README's shape: one vGPU,
    gpumem in MiB, gpucores, HAMi-core's `force` policy), answered by the
    webhook's review, admitted by the stand-in kubelet through the device
    plugin and run by containerd 1.7: the CUDA probe sees the MiB asked and
    OOMs there; the load generator holds the hard 30 %."""
    import base64
    import copy
    import json

    import jsonpatch

    from gpuslice.admission.review import Settings, answer

    fill_gpu_1(node)
    hami_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hami-train", "namespace": "default"},
                "spec": {"schedulerName": "hami-scheduler", "containers": [{
                    "name": "cuda", "image": "busybox", "env": [{"name": "GPU_CORE_UTILIZATION_POLICY",
                                                                  "value": "force"}],
                    "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4096,
                                             "nvidia.com/gpucores": 30}}}]}}  # fmt: skip
    got = answer({"request": {"uid": "r1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                              "operation": "CREATE", "object": hami_pod}},
                 Settings("devicePlugin", schedulers={"hami-scheduler": "default-scheduler"}))["response"]  # fmt: skip
    assert got["allowed"] and got["patchType"] == "JSONPatch"
    p = as_the_api_server_stores_it(
        jsonpatch.apply_patch(copy.deepcopy(hami_pod), json.loads(base64.b64decode(got["patch"])))
    )
    assert p["spec"]["schedulerName"] == "default-scheduler"
    assert p["spec"]["containers"][0]["resources"]["limits"] == {"gpuslice.io/memory": "4", "gpuslice.io/cores": "30"}
    assert node.admit(p)["admitted"], node.log()
    sandbox = Pod(cri, tmp_path / "logs", "hami-train", {}, handler="")
    opts = node.options(p, container="cuda")
    env = {e["name"]: e["value"] for e in p["spec"]["containers"][0]["env"]}  # the rewritten container's own
    assert env["GPUSLICE_COMPUTE_POLICY"] == "hard"  # HAMi-core's force
    kw = {"cdi_devices": opts["cdi_devices"], "env": {**opts["envs"], **env}}
    try:
        sandbox.run("probe", **kw)
        out = sandbox.probe("probe")
        assert out["total"] == 4096 << 20 and out["allocated"] == 4096 << 20, out  # the MiB HAMi's pod asked
        assert out["then"] == "CUDA_ERROR_OUT_OF_MEMORY", out
        sandbox.run("load", [rootfs.LOAD, "8", "100"], **kw)
        used = share_of(sandbox, "load", 8)
        print(f"a HAMi pod rewritten, gpucores 30 with force, alone on its GPU: {used:.1f} %")
        assert abs(used - 30) <= 1.0
    finally:
        sandbox.close()
    node.delete(p)

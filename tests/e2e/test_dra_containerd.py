"""DRA end to end on containerd 1.7 (Debian 13's, CDI in its CRI): the
kubelet plugin prepares claims exactly as kube-scheduler allocated them (a
stand-in kubelet over the kubelet's own protos, a stand-in API server), the
kubelet-like CRI client creates containers with the returned CDI device IDs,
and inside them the CUDA probe and load generator run through the interposer
on the simulated GPUs. Nothing else is mocked: real containerd, runc, the
hook, the daemon, and the plugin as `gpuslice kubelet-plugin`."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslice.cli import rootfs
from tests.clients.cri import Kubelet
from tests.harness.containerd import HOLD, NEEDS_CRI, Pod, cdi_kubelet
from tests.harness.dra import DraNode, Result, allocated
from tests.harness.gpu_node import GpuNode
from tests.harness.gpu_node import gpu_node as sim_gpu_node

GiB = 1 << 30
SPEC_PATH = Path("/var/run/cdi/gpuslice-dra.json")
CDI_DIR = Path("/var/run/cdi")  # where containerd looks, and the plugin writes each claim's spec
# The probe uses CUDA device 0. The simulator shows a container every GPU (a real
# driver shows only those whose device nodes CDI gave it), so claims the probe
# reads are on GPU 0.

pytestmark = NEEDS_CRI


@pytest.fixture(scope="module")
def gpu_node(tmp_path_factory) -> Iterator[GpuNode]:
    with sim_gpu_node(tmp_path_factory.mktemp("daemon"), SPEC_PATH, gpus=2) as node:
        yield node


@pytest.fixture(scope="module")
def kubelet(gpu_node, tmp_path_factory) -> Iterator[Kubelet]:
    """containerd 1.7 with the node's config plus `gpuslice install containerd` (enable_cdi)."""
    with cdi_kubelet(tmp_path_factory, gpu_node.shim) as client:
        yield client


@pytest.fixture
def dra(gpu_node, tmp_path) -> Iterator[DraNode]:
    node = DraNode(gpu_node.daemon, SPEC_PATH, tmp_path, CDI_DIR)
    node.start_plugin()
    yield node
    node.close()
    for left in CDI_DIR.glob("gpuslice.io-claim_*.json"):  # the admin specs too
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


def devices_of(dra: DraNode, *claims: dict) -> list[list[str]]:
    """Each claim's CDI device IDs, as the kubelet passes them to a container
    that names the whole claim."""
    for c in claims:
        dra.api.put_claim(c)
    answers = dra.prepare(*claims)
    ids = []
    for c in claims:
        answer = answers[c["metadata"]["uid"]]
        assert answer.get("error", "") == "", answer
        ids.append([i for d in answer["devices"] for i in d["cdi_device_ids"]])
    return ids


def prepared(dra: DraNode, *claims: dict) -> list[list[str]]:
    return devices_of(dra, *claims)


def json_lines(pod: Pod, name: str) -> list[dict]:
    log = pod.logs / f"{name}.log"
    lines = [line.split(" ", 3)[-1] for line in log.read_text().splitlines()] if log.exists() else []
    return [json.loads(t) for t in lines if t.startswith("{")]


def share_of(pod: Pod, name: str, seconds: float, since_ns: int = 0) -> float:
    """The load generator's GPU share from its own exact accounting, after 2 s of settling
    (or from `since_ns`, on the monotonic clock, if later), to its end."""
    deadline = time.monotonic() + seconds + 30
    while not any(r.get("done") for r in json_lines(pod, name)):
        assert time.monotonic() < deadline, json_lines(pod, name)[-3:]
        time.sleep(0.2)
    points = [(r["t"], r["busy"]) for r in json_lines(pod, name) if "busy" in r]
    (t0, b0), (t1, b1) = next(p for p in points[20:] if p[0] >= since_ns), points[-1]
    return 100 * (b1 - b0) / (t1 - t0)


@pytest.mark.measure  # a share measured over seconds: last, beside measuring tests only, under xdist
def test_a_claims_containers_get_exactly_its_memory_and_share_and_it_goes_away(dra, pods, gpu_node):
    config = [{"source": "FromClaim", "opaque": {"driver": "gpuslice.io", "parameters": {
        "apiVersion": "gpuslice.io/v1", "kind": "SliceConfig", "computePolicy": "hard"}}}]  # fmt: skip
    claim = allocated("train", ("gpu-0", "4Gi", "30"), config=config)
    [devices] = prepared(dra, claim)
    pod = pods("train")
    probe = pod.run("probe", cdi_devices=devices)
    load = pod.run("load", [rootfs.LOAD, "7", "100"], cdi_devices=devices)
    out = pod.probe("probe")
    assert out["total"] == 4 * GiB and out["allocated"] == 4 * GiB and out["then"] == "CUDA_ERROR_OUT_OF_MEMORY"
    uid = claim["metadata"]["uid"]
    held = {s.container_id: s for s in gpu_node.slices()}
    ledger = held[probe].member_of
    assert set(held) == {f"claim-{uid}", ledger, probe, load} and held[load].member_of == ledger  # one ledger
    used = share_of(pod, "load", 7)
    print(f"a hard 30 % claim's container: {used:.1f} %")
    assert abs(used - 30) <= 3
    pod.close()
    assert {s.container_id for s in gpu_node.wait_slices(1)} == {f"claim-{uid}"}  # the containers left it
    assert dra.unprepare(claim)[uid] == {"error": ""}
    assert gpu_node.wait_slices(0) == [] and not (CDI_DIR / f"gpuslice.io-claim_{uid}.json").exists()


def test_two_containers_of_one_claim_share_its_memory(dra, pods, gpu_node):
    claim = allocated("shared", ("gpu-0", "3Gi", None))
    [devices] = prepared(dra, claim)
    pod = pods("shared")
    holding = [rootfs.PROBE, "64", "600"]  # allocates to the limit, then keeps it
    pod.run("first", holding, cdi_devices=devices)
    first = pod.probe("first")
    pod.run("second", holding, cdi_devices=devices)
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
        pod.run(name, cdi_devices=device)
    totals = {name: pod.probe(name)["total"] for name in ("small", "large", "pair")}
    assert totals == {"small": 1 * GiB, "large": 5 * GiB, "pair": 2 * GiB}
    claim_slice = {s.container_id: s for s in gpu_node.slices()}[f"claim-{pair['metadata']['uid']}"]
    assert sorted(g.index for g in claim_slice.gpus) == [0, 1]
    pod.close()
    dra.unprepare(small, large, pair)
    assert gpu_node.wait_slices(0) == []


def test_a_plugin_restart_between_prepare_and_unprepare(dra, pods, gpu_node):
    claim = allocated("steady", ("gpu-0", "2Gi", None))
    [devices] = prepared(dra, claim)
    pod = pods("steady")
    pod.run("app", HOLD, cdi_devices=devices)
    assert pod.probe("app")["total"] == 2 * GiB
    dra.stop_plugin(signal.SIGKILL)
    dra.start_plugin()
    pod.close()
    uid = claim["metadata"]["uid"]
    assert dra.unprepare(claim)[uid] == {"error": ""}
    assert gpu_node.wait_slices(0) == [] and not (CDI_DIR / f"gpuslice.io-claim_{uid}.json").exists()


def test_two_containers_naming_the_two_requests_of_one_claim_on_one_gpu(dra, pods, gpu_node):
    """kube-scheduler 1.36 puts both requests of one claim on gpu-0. Each
    container names one request (resources.claims[].request): the kubelet
    passes it that request's CDI device only (pkg/kubelet/cm/dra
    claiminfo.go cdiDevicesAsList), and inside it sees and hits exactly its
    own request's memory, never the other's."""
    claim = allocated("two", Result("gpu-0", "3Gi", "20", "a"), Result("gpu-0", "1Gi", "10", "b"))
    dra.api.put_claim(claim)
    answer = dra.prepare(claim)[claim["metadata"]["uid"]]
    assert answer.get("error", "") == "", answer
    by_request = {d["request_names"][0]: d["cdi_device_ids"] for d in answer["devices"]}
    pod = pods("two")
    pod.run("a", cdi_devices=by_request["a"])
    pod.run("b", cdi_devices=by_request["b"])
    got = {name: pod.probe(name) for name in ("a", "b")}
    for name, size in (("a", 3 * GiB), ("b", 1 * GiB)):
        out = got[name]
        assert (out["total"], out["allocated"], out["then"]) == (size, size, "CUDA_ERROR_OUT_OF_MEMORY"), (name, out)
    gpu0 = gpu_node.daemon.client().inventory().gpus[0]
    assert (gpu0.memory_reserved, gpu0.cores_reserved) == (4 * GiB, 30)  # the scheduler's books
    pod.close()
    uid = claim["metadata"]["uid"]
    assert dra.unprepare(claim)[uid] == {"error": ""}
    assert gpu_node.wait_slices(0) == [] and not list(CDI_DIR.glob(f"gpuslice.io-claim_{uid}*.json"))


def test_a_claim_the_gpu_has_no_room_for_reserves_nothing(dra, gpu_node):
    """The daemon's books hold a container's 10 GiB the scheduler does not
    see (the RuntimeClass path beside DRA): the claim fails in one line."""
    gpu_node.daemon.client().reserve("beside", {"gpuslice.io/memory": "10Gi", "gpuslice.io/device": "0"})
    claim = allocated("late", ("gpu-0", "8Gi", "0"))
    dra.api.put_claim(claim)
    error = dra.prepare(claim)[claim["metadata"]["uid"]]["error"]
    assert error.startswith("claim ml/late: no room for 8.0 GiB and 0 cores: GPU 0"), error
    assert [s.container_id for s in gpu_node.slices()] == ["beside"]
    assert not list(CDI_DIR.glob("gpuslice.io-claim_*.json"))


@pytest.mark.parametrize("forged", ["GPUSLICE_SHARE_x_0={uid}/{share}", "GPUSLICE_CLAIM={uid}"])
def test_a_pod_cannot_join_another_pods_claim_through_its_env(dra, pods, gpu_node, forged):
    """The attack, through containerd's CRI as a kubelet sends it: a pod with a
    GPU through the node spec's device (the hook-only path) sets another
    pod's claim UID and share ID (both readable in the API) in its env. Before,
    it joined that claim's slice; now StartContainer fails with one line and
    the claim keeps its slice to itself."""
    import grpc

    claim = allocated("victim", ("gpu-0", "4Gi", "30"))
    prepared(dra, claim)
    uid = claim["metadata"]["uid"]
    share = claim["status"]["allocation"]["devices"]["results"][0]["shareID"]
    name, _, value = forged.format(uid=uid, share=share).partition("=")
    pod = pods("intruder")
    with pytest.raises(grpc.RpcError) as e:
        pod.run("app", cdi_devices=["gpuslice.io/gpu=0"], env={name: value})
    assert uid in e.value.details() and ("not given its device" in e.value.details() or name in e.value.details())
    assert {s.container_id for s in gpu_node.slices()} == {f"claim-{uid}"}
    pod.close()
    assert dra.unprepare(claim)[uid] == {"error": ""}


def test_a_hami_pod_rewritten_for_dra_sees_exactly_what_it_asked_in_its_container(dra, pods, gpu_node):
    """A pod written for HAMi (3000 MiB, 30 cores, HAMi-core's force, not on GPU 1), rewritten
    by the admission webhook in mode dra; its claim made from the webhook's template and
    allocated where the chart's DeviceClass and the template's selectors hold
    (tests/harness/dra_scheduler.py), prepared, and given to a container through CDI: inside,
    CUDA sees and hits the 3072 MiB the GPU's 256 MiB steps make of 3000, on GPU 0."""
    from gpuslice.admission import hami
    from gpuslice.admission.rewrite import rewrite
    from tests.harness.dra_scheduler import allocate, claim_from, device_classes, published

    classes = device_classes()
    pod_spec = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "hami", "namespace": "ml", "annotations": {hami.NOUSE_INDEX: "1"}},
                "spec": {"containers": [{"name": "cuda", "image": "cuda:12", "resources": {"limits": {
                    "nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}},
                    "env": [{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"}]}]}}  # fmt: skip
    [t] = rewrite(pod_spec, "dra").templates
    claim = claim_from(t, "ml", "hami", "gpuslice-0")
    assert allocate(claim, published(dra), classes) == ["gpu-0"]
    [devices] = prepared(dra, claim)
    pod = pods("hami")
    pod.run("cuda", cdi_devices=devices)
    out = pod.probe("cuda")
    assert (out["total"], out["allocated"], out["then"]) == (3 * GiB, 3 * GiB, "CUDA_ERROR_OUT_OF_MEMORY")
    held = {s.container_id: s for s in gpu_node.slices()}[f"claim-{claim['metadata']['uid']}"]
    assert [(g.index, g.memory_limit, g.cores) for g in held.gpus] == [(0, 3 * GiB, 30)] and held.policy == "hard"
    pod.close()
    assert dra.unprepare(claim)[claim["metadata"]["uid"]] == {"error": ""}

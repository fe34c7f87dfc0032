"""A pod written for HAMi, rewritten by the admission webhook in mode dra
(admission/), served by the gpuslice.io DRA driver on the simulator, each
step as the real component takes it:

- kube-controller-manager's resourceclaim controller makes the pod's claim
  from the webhook's template, and kube-scheduler allocates it on a device
  of the ResourceSlice the kubelet plugin publishes where the DeviceClass's
  selectors (the chart's, rendered by the real helm) and the request's hold
  (tests/harness/dra_scheduler.py: cel-python standing in for cel-go);
- the stand-in kubelet prepares the claim through the DRA API.

The slice then holds what the HAMi pod asked, on the GPU its annotations let
it have."""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice.admission import hami
from gpuslice.admission.rewrite import rewrite
from gpuslice.dra.claims import quantity
from tests.harness.dra import DraNode
from tests.harness.dra_scheduler import allocate, claim_from, device_classes, published
from tools.api_server import validate

GiB = 1 << 30
MiB = 1 << 20
A100, H100 = "NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def classes() -> dict[str, dict]:
    return device_classes()


@pytest.fixture
def node(daemon, tmp_path):  # type: ignore[no-untyped-def]
    d = daemon([{"memory": "16Gi", "name": A100}, {"memory": "16Gi", "name": H100}])
    with DraNode.serving(d, tmp_path) as n:
        yield n


def hami_pod(limits: dict[str, Any], annotations: dict[str, str], policy: str = "force") -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train", "namespace": "ml",
                                                            "annotations": annotations},
            "spec": {"containers": [{"name": "cuda", "image": "cuda:12", "resources": {"limits": limits},
                                     "env": [{"name": "GPU_CORE_UTILIZATION_POLICY", "value": policy}]}]}}  # fmt: skip


def claim_of(pod: dict) -> dict:
    """The webhook's rewrite, then the claim the resourceclaim controller makes of its one template."""
    r = rewrite(pod, "dra")
    [t] = r.templates
    validate({**t, "metadata": {**t["metadata"], "namespace": "ml"}})
    return claim_from(t, "ml", pod["metadata"]["name"], "gpuslice-0")


def test_hamis_vgpu_on_the_gpu_type_it_asks_is_a_slice_of_what_it_asked(node, classes):
    pod = hami_pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30,
                    "nvidia.com/priority": 0}, {hami.USE_TYPE: "h100"})  # fmt: skip
    claim = claim_of(pod)
    assert allocate(claim, published(node), classes) == ["gpu-1"]  # the H100, whatever the case
    node.api.put_claim(claim)
    uid = claim["metadata"]["uid"]
    assert node.prepare(claim)[uid].get("error", "") == ""
    s = node.slices()[f"claim-{uid}"]
    h100 = node.d.client().inventory().gpus[1]
    # 3000 MiB asked, its 256 MiB steps consumed: never less than asked
    assert [(g.uuid, g.memory_limit, g.cores) for g in s.gpus] == [(h100.uuid, 3072 * MiB, 30)]
    assert (s.policy, s.priority) == ("hard", "high")  # HAMi-core's force, HAMi's priority 0
    assert node.unprepare(claim)[uid] == {"error": ""}


def test_the_gpus_a_hami_pod_avoids_or_names_are_the_ones_it_gets_or_none(node, classes):
    devices = published(node)
    inventory = node.d.client().inventory().gpus
    memory = {"nvidia.com/gpumem": 1000}
    assert allocate(claim_of(hami_pod(memory, {hami.NOUSE_TYPE: "H100"})), devices, classes) == ["gpu-0"]
    assert allocate(claim_of(hami_pod(memory, {hami.USE_TYPE: "V100,T4"})), devices, classes) == []
    assert allocate(claim_of(hami_pod(memory, {hami.NOUSE_UUID: inventory[0].uuid})), devices, classes) == ["gpu-1"]
    assert allocate(claim_of(hami_pod(memory, {hami.USE_INDEX: "1"})), devices, classes) == ["gpu-1"]
    assert allocate(claim_of(hami_pod(memory, {hami.USE_TYPE: "A100", hami.NOUSE_INDEX: "0"})), devices,
                    classes) == []  # fmt: skip
    # a whole GPU, pinned by UUID: the class's defaults (all of its memory), booked whole
    whole = claim_of(hami_pod({"nvidia.com/gpu": 1}, {hami.USE_UUID: inventory[0].uuid}))
    assert allocate(whole, devices, classes) == ["gpu-0"]
    node.api.put_claim(whole)
    uid = whole["metadata"]["uid"]
    assert node.prepare(whole)[uid].get("error", "") == ""
    s = node.slices()[f"claim-{uid}"]
    assert s.whole and [(g.uuid, g.memory_limit, g.cores) for g in s.gpus] == [(inventory[0].uuid, 16 * GiB, 100)]
    consumed = whole["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]
    assert quantity(consumed["memory"], "memory") == 16 * GiB

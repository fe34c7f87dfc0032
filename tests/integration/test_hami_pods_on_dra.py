"""A pod written for HAMi, rewritten by the admission webhook in mode dra
(admission/), served by the gpuslice.io DRA driver on the simulator, each
step as the real component takes it:

- kube-controller-manager's resourceclaim controller makes the pod's claim
  from the webhook's template: the template's spec, in the pod's namespace;
- kube-scheduler's allocator takes a device of the ResourceSlice the kubelet
  plugin publishes where the DeviceClass's selectors (the chart's, rendered
  by the real helm) and the request's are all true, evaluated here by
  cel-python standing in for cel-go, and consumes its capacity as the
  device's requestPolicy has it (a request rounded up to the next step of
  its validRange; what a request leaves out, the default); the class's
  configuration and the claim's go into the allocation (FromClass,
  FromClaim);
- the stand-in kubelet prepares the claim through the DRA API.

The slice then holds what the HAMi pod asked, on the GPU its annotations let
it have."""

from __future__ import annotations

import copy
import time
import uuid
from typing import Any

import celpy
import pytest

from gpuslice.admission import hami
from gpuslice.admission.rewrite import rewrite
from gpuslice.cli import sim_daemon
from gpuslice.dra.claims import quantity
from tests.harness.dra import NODE, DraNode
from tests.harness.helm import template as chart
from tools.api_server import validate

GiB = 1 << 30
MiB = 1 << 20
A100, H100 = "NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3"
CEL = celpy.Environment()


@pytest.fixture(scope="module")
def classes() -> dict[str, dict]:
    """The chart's DeviceClasses (mode dra), by name."""
    return {o["metadata"]["name"]: o for o in chart("1.37.0", "mode=dra") if o["kind"] == "DeviceClass"}


@pytest.fixture
def node(daemon, tmp_path):  # type: ignore[no-untyped-def]
    d = daemon([{"memory": "16Gi", "name": A100}, {"memory": "16Gi", "name": H100}])
    spec = tmp_path / "cdi" / "gpuslice.json"
    spec.parent.mkdir()
    r = sim_daemon.cdi_generate(d, spec)
    assert r.returncode == 0, r.stderr
    n = DraNode(d, spec, tmp_path, tmp_path / "run-cdi")
    n.start_plugin()
    yield n
    n.close()


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
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"train-gpuslice-0-{uuid.uuid4().hex[:5]}", "namespace": "ml",
                         "uid": str(uuid.uuid4())},
            "spec": copy.deepcopy(t["spec"]["spec"])}  # fmt: skip


def _typed(value: dict[str, Any]) -> Any:
    """A ResourceSlice attribute's value as CEL sees it (DeviceAttribute: one of int, bool, string, version)."""
    [v] = value.values()
    return v


def passes(expression: str, device: dict, driver: str = "gpuslice.io") -> bool:
    """A CEL selector on one published device: its attributes by domain (an unqualified name is the
    driver's), as the allocator's `device` variable has them."""
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in device.get("attributes", {}).items():
        domain, _, short = name.rpartition("/")
        attributes.setdefault(domain or driver, {})[short] = _typed(value)
    activation = celpy.json_to_cel({"device": {"driver": driver, "attributes": attributes}})
    return bool(CEL.program(CEL.compile(expression)).evaluate(activation))


def _consumed(capacity: dict, asked: str | None) -> str:
    """A request's amount as the device's requestPolicy consumes it: the default where none is
    asked, else rounded up to the next step of its validRange."""
    policy = capacity["requestPolicy"]
    if asked is None:
        return str(policy["default"])
    want, low = quantity(asked, "asked"), quantity(policy["validRange"]["min"], "min")
    step = quantity(policy["validRange"]["step"], "step")
    return str(low + -(-(max(want, low) - low) // step) * step)


def allocate(claim: dict, slice_: dict, classes: dict[str, dict]) -> list[str]:
    """kube-scheduler's allocation of a one-request claim on this node, into its status; the devices taken."""
    [req] = claim["spec"]["devices"]["requests"]
    exactly = req["exactly"]
    cls = classes[exactly["deviceClassName"]]
    selectors = [s["cel"]["expression"] for s in [*cls["spec"]["selectors"], *exactly.get("selectors", [])]]
    fit = [d for d in slice_["spec"]["devices"] if all(passes(e, d) for e in selectors)]
    taken = fit[: exactly.get("count", 1)]
    if len(taken) < exactly.get("count", 1):
        return []  # unschedulable here: the pod waits for a node that has them
    asked = (exactly.get("capacity") or {}).get("requests") or {}
    results = [{"request": req["name"], "driver": "gpuslice.io", "pool": NODE, "device": d["name"],
                "shareID": str(uuid.uuid4()),
                "consumedCapacity": {k: _consumed(c, asked.get(k)) for k, c in d["capacity"].items()}}
               for d in taken]  # fmt: skip
    config = [{"source": "FromClass", "requests": [req["name"]], **c} for c in cls["spec"].get("config", [])]
    config += [{"source": "FromClaim", **c} for c in claim["spec"]["devices"].get("config", [])]
    claim["status"] = {"allocation": {
        "devices": {"results": results, **({"config": config} if config else {})},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}}}  # fmt: skip
    return [d["name"] for d in taken]


def published(node: DraNode) -> dict:
    deadline = time.monotonic() + 20
    while f"{NODE}-gpuslice.io" not in node.api.slices:
        assert time.monotonic() < deadline, (node.api.invalid, node.log())
        time.sleep(0.05)
    return node.api.slices[f"{NODE}-gpuslice.io"]


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

"""kube-scheduler's part, for tests of claims written by others (the admission
webhook's templates, mode dra): a claim made from a ResourceClaimTemplate as
kube-controller-manager's resourceclaim controller makes one (the template's
spec, in the pod's namespace), and its allocation on this node as
kube-scheduler's allocator (k8s.io/dynamic-resource-allocation/structured)
writes it: a device of the node's ResourceSlice where the DeviceClass's
selectors and the request's are all true, evaluated by cel-python standing in
for cel-go; each capacity consumed as the device's requestPolicy has it (a
request rounded up to the next step of its validRange; what a request leaves
out, the default); the class's configuration and the claim's in the
allocation (FromClass, FromClaim). One request, `exactly`, a fresh node: what
those tests write, no more."""

from __future__ import annotations

import copy
import time
import uuid
from typing import Any

import celpy

from gpuslice.dra.claims import quantity
from tools.dra_node import NODE, PluginNode

CEL = celpy.Environment()


def device_classes(kube_version: str = "1.37.0") -> dict[str, dict[str, Any]]:
    """The chart's DeviceClasses in mode dra, by name, as the real helm renders them."""
    from tests.harness.helm import template

    return {o["metadata"]["name"]: o for o in template(kube_version, "mode=dra") if o["kind"] == "DeviceClass"}


def claim_from(template: dict[str, Any], namespace: str, pod: str, name: str) -> dict[str, Any]:
    """The claim the resourceclaim controller makes for a pod's claim `name` from `template`."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"{pod}-{name}-{uuid.uuid4().hex[:5]}", "namespace": namespace,
                         "uid": str(uuid.uuid4())},
            "spec": copy.deepcopy(template["spec"]["spec"])}  # fmt: skip


def passes(expression: str, device: dict[str, Any], driver: str = "gpuslice.io") -> bool:
    """A CEL selector on one published device: its attributes by domain (an unqualified name is the
    driver's), each DeviceAttribute's one value, as the allocator's `device` variable has them."""
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in device.get("attributes", {}).items():
        domain, _, short = name.rpartition("/")
        [attributes.setdefault(domain or driver, {})[short]] = value.values()
    activation = celpy.json_to_cel({"device": {"driver": driver, "attributes": attributes}})
    return bool(CEL.program(CEL.compile(expression)).evaluate(activation))


def _consumed(capacity: dict[str, Any], asked: str | None) -> str:
    policy = capacity["requestPolicy"]
    if asked is None:
        return str(policy["default"])
    want, low = quantity(asked, "asked"), quantity(policy["validRange"]["min"], "min")
    step = quantity(policy["validRange"]["step"], "step")
    return str(low + -(-(max(want, low) - low) // step) * step)


def allocate(claim: dict[str, Any], slice_: dict[str, Any], classes: dict[str, dict[str, Any]]) -> list[str]:
    """The claim allocated on this node, into its status; the devices taken ([]: none fits, and the
    pod waits for a node that has them)."""
    [req] = claim["spec"]["devices"]["requests"]
    exactly = req["exactly"]
    cls = classes[exactly["deviceClassName"]]
    selectors = [s["cel"]["expression"] for s in [*cls["spec"]["selectors"], *exactly.get("selectors", [])]]
    fit = [d for d in slice_["spec"]["devices"] if all(passes(e, d) for e in selectors)]
    count = exactly.get("count", 1)
    if len(fit) < count:
        return []
    taken = fit[:count]
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


def published(node: PluginNode, timeout: float = 20.0) -> dict[str, Any]:
    """The node's ResourceSlice, once its plugin has published it."""
    deadline = time.monotonic() + timeout
    while f"{NODE}-gpuslice.io" not in node.api.slices:
        assert time.monotonic() < deadline, (node.api.invalid, node.log())
        time.sleep(0.05)
    return node.api.slices[f"{NODE}-gpuslice.io"]

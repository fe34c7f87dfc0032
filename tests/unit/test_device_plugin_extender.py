"""The scheduler extender's decisions (device_plugin/extender.py) and the
per-GPU state it reads (device_plugin/node_gpus.py), in process: node states
where a node's totals fit and no GPU of it does, pods placed one after
another before their nodes count them, and bad input."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuslice.device_plugin import extender, node_gpus
from gpuslice.device_plugin import units as u
from gpuslice.device_plugin.admission import Held
from gpuslice.device_plugin.node_gpus import GpuFree, NodeGpus
from gpuslice.proto import gpuslice_pb2 as pb

pytestmark = pytest.mark.unit

GiB = 1 << 30
A, B = "GPU-aaaa", "GPU-bbbb"


def node(name: str, state: NodeGpus | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if state is not None:
        meta["annotations"] = {node_gpus.ANNOTATION: state.encode()}
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta}


def pod(name: str, *containers: dict[str, int]) -> dict[str, Any]:
    spec = [
        {"name": f"c{i}", "image": "busybox", "resources": {"limits": {k: str(v) for k, v in c.items()}}}
        for i, c in enumerate(containers)
    ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns"},
            "spec": {"containers": spec}}  # fmt: skip


def args(p: dict[str, Any], *nodes: dict[str, Any]) -> dict[str, Any]:
    return {"Pod": p, "Nodes": {"items": list(nodes)}, "NodeNames": None}


def kept(result: dict[str, Any]) -> list[str]:
    assert result["Error"] == ""
    return [n["metadata"]["name"] for n in result["Nodes"]["items"]]


# a node whose totals (16 memory, 100 cores) fit an 8-and-50 pod, but no GPU does
SPLIT = NodeGpus({A: GpuFree(10, 5, False, 16), B: GpuFree(6, 95, False, 16)}, frozenset())
ROOMY = NodeGpus({A: GpuFree(16, 100, True, 16)}, frozenset())


def test_a_node_whose_totals_fit_but_no_gpu_is_filtered_out_naming_each_gpu():
    e = extender.Extender()
    out = e.filter(args(pod("p", {u.MEMORY: 8, u.CORES: 50}), node("split", SPLIT), node("roomy", ROOMY)))
    assert kept(out) == ["roomy"]
    assert out["FailedNodes"]["split"] == (
        "gpuslice: container 0 asks 8 memory and 50 cores on one GPU; free: "
        f"{A} has 10 memory and 5 cores; {B} has 6 memory and 95 cores"
    )
    out = e.filter(args(pod("q", {u.MEMORY: 8, u.CORES: 50}), node("split", SPLIT)))
    assert kept(out) == [] and "split" in out["FailedNodes"]


def test_binpack_chooses_the_fuller_node_and_spread_the_emptier_and_the_rest_are_told_why():
    busy = NodeGpus({A: GpuFree(8, 50, False, 16)}, frozenset())
    nodes = [node("roomy", ROOMY), node("busy", busy)]
    out = extender.Extender().filter(args(pod("p", {u.MEMORY: 4}), *nodes))
    assert kept(out) == ["busy"]
    assert out["FailedNodes"] == {"roomy": "gpuslice placed the pod on busy, which scores higher by binpack"}
    assert kept(extender.Extender(spread=True).filter(args(pod("p", {u.MEMORY: 4}), *nodes))) == ["roomy"]


def test_pods_placed_before_their_node_counts_them_are_taken_off_its_free_units():
    clock = [0.0]
    e = extender.Extender(assumed_s=60, clock=lambda: clock[0])
    one_gpu = NodeGpus({A: GpuFree(16, 100, True, 16)}, frozenset())
    nodes = [node("n1", one_gpu), node("n2", one_gpu)]
    assert kept(e.filter(args(pod("first", {u.MEMORY: 12}), *nodes))) == ["n1"]
    # the second pod's filter comes before the first reaches n1: n1 is known to have 4 left
    assert kept(e.filter(args(pod("second", {u.MEMORY: 12}), *nodes))) == ["n2"]
    out = e.filter(args(pod("third", {u.MEMORY: 12}), *nodes))
    assert kept(out) == [] and "4 memory" in out["FailedNodes"]["n1"]
    # n1's plugin now counts "first": its own state says what is free, nothing is taken twice
    counted = NodeGpus({A: GpuFree(4, 100, False, 16)}, frozenset({"ns/first"}))
    out = e.filter(args(pod("third", {u.MEMORY: 4}), node("n1", counted)))
    assert kept(out) == ["n1"]
    # a pod never counted is forgotten after assumed_s
    clock[0] = 61
    assert kept(e.filter(args(pod("fourth", {u.MEMORY: 12}), node("n2", one_gpu)))) == ["n2"]


def test_a_pod_scheduled_again_is_not_counted_against_itself():
    e = extender.Extender()
    one = [node("n1", NodeGpus({A: GpuFree(16, 100, True, 16)}, frozenset()))]
    p = pod("again", {u.MEMORY: 12})
    assert kept(e.filter(args(p, *one))) == ["n1"]
    assert kept(e.filter(args(p, *one))) == ["n1"]
    assert e.prioritize(args(p, *one)) == [{"Host": "n1", "Score": 8}]


def test_whole_gpus_go_where_no_slice_is():
    mixed = NodeGpus({A: GpuFree(15, 100, False, 16), B: GpuFree(16, 100, True, 16)}, frozenset())
    e = extender.Extender()
    assert kept(e.filter(args(pod("w", {u.GPU: 1}), node("mixed", mixed)))) == ["mixed"]
    out = e.filter(args(pod("w2", {u.GPU: 1}), node("mixed", mixed)))
    assert kept(out) == [] and out["FailedNodes"]["mixed"] == "gpuslice: container 0 asks 1 whole GPUs; 0 have no slice"


def test_nodes_without_state_are_unresolvable_and_pods_of_no_interest_pass():
    e = extender.Extender()
    out = e.filter(args(pod("p", {u.MEMORY: 1}), node("plain", None), node("roomy", ROOMY)))
    assert kept(out) == ["roomy"]
    assert "publishes no per-GPU state" in out["FailedAndUnresolvableNodes"]["plain"]
    other = pod("cpu", {"cpu": 1})
    assert kept(e.filter(args(other, node("plain", None), node("roomy", ROOMY)))) == ["plain", "roomy"]


@pytest.mark.parametrize("bad,says", [
    (None, "not an ExtenderArgs"),
    ({"Pod": {}, "Nodes": None, "NodeNames": ["n1"]}, "set nodeCacheCapable: false"),
    ({"Pod": {}, "Nodes": {"items": "n1"}}, "Nodes.items is not a list"),
])  # fmt: skip
def test_bad_arguments_fail_the_filter_in_one_line(bad, says):
    out = extender.Extender().filter(bad)
    assert says in out["Error"] and "\n" not in out["Error"] and out["Nodes"]["items"] == []


@pytest.mark.parametrize("text,says", [
    ("{", "not JSON"),
    ('{"v": 2}', "version 2 (accepted: 1"),
    ('{"v": 1, "gpus": {"GPU-a": {"memory": -1, "cores": 1, "whole": false, "memoryUnits": 1}}}', "memory is -1"),
    ('{"v": 1, "gpus": {"GPU-a": 3}}', "GPU GPU-a is 3"),
    ('{"v": 1, "pods": "ns/p"}', "pods is 'ns/p'"),
])  # fmt: skip
def test_a_bad_published_state_makes_its_node_unresolvable_with_the_reason(text, says):
    n = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "odd", "annotations": {node_gpus.ANNOTATION: text}}}
    out = extender.Extender().filter(args(pod("p", {u.MEMORY: 1}), n))
    assert says in out["FailedAndUnresolvableNodes"]["odd"]


def test_the_state_a_node_publishes_counts_what_the_kubelet_gave_and_what_is_whole_or_unhealthy():
    gpus = [
        pb.Gpu(uuid=A, memory_total=16 * GiB, slices=1),
        pb.Gpu(uuid=B, memory_total=16 * GiB),
        pb.Gpu(uuid="GPU-cccc", memory_total=16 * GiB, slices=1, exclusive=True),
        pb.Gpu(uuid="GPU-dddd", memory_total=16 * GiB, health="uncorrectable ECC errors"),
    ]
    held = Held(
        by_container={
            ("ns/p", "c0"): {u.MEMORY: [f"{A}_m{i}" for i in range(6)], u.CORES: [f"{A}_c{i}" for i in range(30)]},
            ("ns/w", "c0"): {u.GPU: ["GPU-cccc_g0"]},
        }
    )
    state = node_gpus.of_node(gpus, held)
    assert state.gpus == {
        A: GpuFree(10, 70, False, 16),
        B: GpuFree(16, 100, True, 16),
        "GPU-cccc": GpuFree(0, 0, False, 16),
        "GPU-dddd": GpuFree(0, 0, False, 16),
    }
    assert state.pods == {"ns/p", "ns/w"}
    assert node_gpus.decode(state.encode()) == state
    assert json.loads(state.encode())["gpus"][A] == {"memory": 10, "cores": 70, "whole": False, "memoryUnits": 16}

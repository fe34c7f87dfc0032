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
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"


def node(name: str, state: NodeGpus | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if state is not None:
        meta["annotations"] = {node_gpus.ANNOTATION: state.encode()}
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta}


def pod(name: str, *containers: dict[str, int], env: dict[str, str] | None = None) -> dict[str, Any]:
    spec = [
        {"name": f"c{i}", "image": "busybox", "resources": {"limits": {k: str(v) for k, v in c.items()}},
         **({"env": [{"name": k, "value": v} for k, v in env.items()]} if env else {})}
        for i, c in enumerate(containers)
    ]  # fmt: skip
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


def test_a_pods_own_node_policy_wins_over_the_extenders_and_one_it_has_not_is_passed_over():
    """scheduler.gpuslice.io/node-policy (what the webhook writes for HAMi's node-scheduler-policy):
    the pod's choice among nodes, in the filter, its line and the scores."""
    from gpuslice.device_plugin.options import NODE_POLICY

    busy = NodeGpus({A: GpuFree(8, 50, False, 16)}, frozenset())
    nodes = [node("roomy", ROOMY), node("busy", busy)]

    def said(policy: str) -> dict[str, Any]:
        p = pod(f"p-{policy}", {u.MEMORY: 4})
        p["metadata"]["annotations"] = {NODE_POLICY: policy}
        return p

    out = extender.Extender().filter(args(said("spread"), *nodes))
    assert kept(out) == ["roomy"]
    assert out["FailedNodes"] == {"busy": "gpuslice placed the pod on roomy, which scores higher by spread"}
    assert kept(extender.Extender(spread=True).filter(args(said("Binpack"), *nodes))) == ["busy"]
    assert kept(extender.Extender().filter(args(said("topology-aware"), *nodes))) == ["busy"]  # the extender's
    scores = {s["Host"]: s["Score"] for s in extender.Extender().prioritize(args(said("spread"), *nodes))}
    assert scores["roomy"] > scores["busy"]


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


# two nodes of two GPUs each: one with an A100 beside an H100 (the H100 the fuller), one with two A100s
MIXED = NodeGpus({A: GpuFree(16, 100, True, 16, 0, A100), B: GpuFree(8, 100, False, 16, 1, H100)}, frozenset())
A100S = NodeGpus({A: GpuFree(16, 100, True, 16, 0, A100), B: GpuFree(16, 100, True, 16, 1, A100)}, frozenset())


@pytest.mark.parametrize("env,on,gpu", [
    ({"GPUSLICE_DEVICE_TYPE": "h100"}, "mixed", B),  # HAMi's use-gputype: contains the word, ignoring case
    ({"GPUSLICE_DEVICE_TYPE": "V100,A100"}, "a100s", None),  # any of the words; the emptier node by spread
    ({"GPUSLICE_AVOID_DEVICE_TYPE": "A100"}, "mixed", B),
    ({"GPUSLICE_DEVICE": "1"}, "a100s", B),  # a pin by index
    ({"GPUSLICE_AVOID_DEVICE": "1"}, "a100s", None),  # by index: GPU 1 of every node
])  # fmt: skip
def test_a_containers_gpu_choice_rules_out_the_gpus_it_may_not_be_given(env, on, gpu):
    e = extender.Extender(spread=True)  # alone, spread would choose the emptier node: a100s
    out = e.filter(args(pod("p", {u.MEMORY: 4}, env=env), node("mixed", MIXED), node("a100s", A100S)))
    assert kept(out) == [on]
    if gpu is not None:
        assert [t.gpu for t in e.assumed["ns/p"].takes] == [gpu]
    else:
        assert {t.gpu for t in e.assumed["ns/p"].takes} <= {A, B}


def test_a_pod_that_may_be_given_no_gpu_of_a_node_is_told_why_and_a_plugin_without_names_admits_no_type():
    e = extender.Extender()
    out = e.filter(args(pod("p", {u.MEMORY: 4}, env={"GPUSLICE_DEVICE_TYPE": "H200"}), node("mixed", MIXED)))
    assert kept(out) == []
    assert out["FailedNodes"]["mixed"] == (
        f"gpuslice: container 0 may be given none of the node's GPUs ({A}: {A100}, not of gpuslice.io/device-type "
        f"H200; {B}: {H100}, not of gpuslice.io/device-type H200)"
    )
    whole = e.filter(args(pod("w", {u.GPU: 1}, env={"GPUSLICE_DEVICE_TYPE": "A100"}), node("a100s", A100S),
                          node("mixed", MIXED)))  # fmt: skip
    assert kept(whole) == ["mixed"] and e.assumed["ns/w"].takes[0].gpu == A  # binpack: the fuller node's idle A100
    # a plugin from before names were published: the GPU's name is unknown, so no type is one it has
    unnamed = NodeGpus({A: GpuFree(16, 100, True, 16)}, frozenset())
    out = e.filter(args(pod("q", {u.MEMORY: 4}, env={"GPUSLICE_DEVICE_TYPE": "A100"}), node("old", unnamed)))
    assert "its name unknown, not of gpuslice.io/device-type A100" in out["FailedNodes"]["old"]
    # a choice its start would refuse fails it everywhere, with the parser's line
    bad = e.filter(args(pod("r", {u.MEMORY: 4}, env={"GPUSLICE_DEVICE_TYPE": "A100;rm"}), node("a100s", A100S)))
    assert (
        kept(bad) == []
        and 'environment variable GPUSLICE_DEVICE_TYPE: "A100;rm" is not valid' in (bad["FailedNodes"]["a100s"])
    )


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
        pb.Gpu(index=0, uuid=A, memory_total=16 * GiB, slices=1, name=H100),
        pb.Gpu(index=1, uuid=B, memory_total=16 * GiB, name=H100),
        pb.Gpu(index=2, uuid="GPU-cccc", memory_total=16 * GiB, slices=1, exclusive=True, name=H100),
        pb.Gpu(index=3, uuid="GPU-dddd", memory_total=16 * GiB, health="uncorrectable ECC errors", name=H100),
    ]
    held = Held(
        by_container={
            ("ns/p", "c0"): {u.MEMORY: [f"{A}_m{i}" for i in range(6)], u.CORES: [f"{A}_c{i}" for i in range(30)]},
            ("ns/w", "c0"): {u.GPU: ["GPU-cccc_g0"]},
        }
    )
    state = node_gpus.of_node(gpus, held)
    assert state.gpus == {
        A: GpuFree(10, 70, False, 16, 0, H100),
        B: GpuFree(16, 100, True, 16, 1, H100),
        "GPU-cccc": GpuFree(0, 0, False, 16, 2, H100),
        "GPU-dddd": GpuFree(0, 0, False, 16, 3, H100),
    }
    assert state.pods == {"ns/p", "ns/w"}
    assert node_gpus.decode(state.encode()) == state
    assert json.loads(state.encode())["gpus"][A] == {"memory": 10, "cores": 70, "whole": False, "memoryUnits": 16,
                                                     "index": 0, "name": H100}  # fmt: skip

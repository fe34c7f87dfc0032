"""The scheduler extender end to end: `gpuslice device-plugin` publishes its
node's per-GPU state on the Node (stand-in API server, each write validated
against the Kubernetes schema), `gpuslice scheduler-extender` (its own
process) is called as kube-scheduler calls it (tests/clients/scheduler_extender.py,
after pkg/scheduler/extender.go), and the pods it places are admitted by the
stand-in kubelet device manager. Node states make per-GPU fit differ from
the node's totals."""

from __future__ import annotations

import copy
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from gpuslice.device_plugin import units as u
from tests.clients.scheduler_extender import ExtenderError, Scheduler
from tests.harness.device_plugin import NODE, DevicePluginNode, pod
from tests.harness.machine import gpu

OTHER = "node-b"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def cluster(daemon, tmp_path):
    n = DevicePluginNode.running(daemon([gpu("16Gi"), gpu("16Gi")]), tmp_path)
    port = free_port()
    log = open(tmp_path / "extender.log", "w")  # noqa: SIM115 - the child's
    ext = subprocess.Popen([sys.executable, "-m", "gpuslice.cli", "scheduler-extender", "--listen",
                            f"127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url + "/healthz", timeout=1).close()
            break
        except OSError:
            assert ext.poll() is None and time.monotonic() < deadline, (tmp_path / "extender.log").read_text()
            time.sleep(0.05)
    yield n, Scheduler(url, (u.MEMORY, u.CORES, u.GPU)), url
    ext.terminate()
    assert ext.wait(10) == 0, (tmp_path / "extender.log").read_text()
    n.close()


def published(n: DevicePluginNode, want, seconds: float = 15) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """The node's published state once `want(state)` holds."""
    deadline = time.monotonic() + seconds
    while True:
        state = n.published()
        if state is not None and want(state):
            return state
        assert time.monotonic() < deadline, (state, n.log())
        time.sleep(0.05)


def other_node(free: int, units: int) -> dict[str, Any]:
    """A second GPU node: one GPU of `units` GiB, `free` of them free."""
    state = {"v": 1, "gpus": {"GPU-0000b0b0-0000-0000-0000-000000000000": {
        "memory": free, "cores": 100, "whole": free == units, "memoryUnits": units}}, "pods": []}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": OTHER, "annotations": {"gpuslice.io/gpus": json.dumps(state)}}}  # fmt: skip


def to_schedule(p: dict[str, Any]) -> dict[str, Any]:
    """The pod as kube-scheduler has it before binding: no node."""
    q = copy.deepcopy(p)
    del q["spec"]["nodeName"]
    return q


def names(nodes: list[dict[str, Any]]) -> list[str]:
    return [x["metadata"]["name"] for x in nodes]


def test_the_extender_keeps_pods_off_nodes_whose_totals_fit_but_no_gpu_does(cluster):
    n, scheduler, _ = cluster
    state = published(n, lambda s: len(s["gpus"]) == 2)
    free = {"memory": 16, "cores": 100, "whole": True, "memoryUnits": 16, "name": "gpuslice Simulated GPU"}
    assert sorted(g.pop("index") for g in state["gpus"].values()) == [0, 1]  # what a GPU choice is held against
    assert all(g == free for g in state["gpus"].values())
    # one pod on each GPU: 6 GiB left on each, 12 on the node
    for name in ("a", "b"):
        assert n.admit(pod(name, {"memory": 10, "cores": 10})) == {"admitted": True}
    # the kubelet allocates a container's resources one plugin at a time: until both pods'
    # cores are held too, a GPU may show its memory taken and its cores not
    published(n, lambda s: sorted((g["memory"], g["cores"]) for g in s["gpus"].values()) == [(6, 90), (6, 90)])
    state = published(n, lambda s: sorted(s["pods"]) == ["default/a", "default/b"])

    node_a = n.api.nodes[NODE]
    c = pod("c", {"memory": 8, "cores": 10})  # the node's totals (12 GiB) fit it; neither GPU does
    kept, failed, unresolvable = scheduler.filter(to_schedule(c), [node_a, other_node(free=40, units=80)])
    assert names(kept) == [OTHER] and not unresolvable
    assert failed[NODE].startswith("gpuslice: container 0 asks 8 memory and 10 cores on one GPU; free: GPU-")
    assert failed[NODE].count("has 6 memory and 90 cores") == 2
    # without the extender, the same pod on this node is what the kubelet refuses at admission
    refused = n.admit(c)
    assert refused["admitted"] is False and "on one GPU; free:" in refused["message"]

    # pods placed one after another, before the node's plugin has counted them
    d, e, f = (pod(x, {"memory": 6, "cores": 10}) for x in "def")
    other = other_node(free=70, units=80)
    for p in (d, e):
        kept, _, _ = scheduler.filter(to_schedule(p), [n.api.nodes[NODE], other])
        assert names(kept) == [NODE]  # binpack: the fuller node
    kept, failed, _ = scheduler.filter(to_schedule(f), [n.api.nodes[NODE], other])
    assert names(kept) == [OTHER], failed
    for p in (d, e):
        assert n.admit(p) == {"admitted": True}
    state = published(n, lambda s: {"default/d", "default/e"} <= set(s["pods"]))
    assert [g["memory"] for g in state["gpus"].values()] == [0, 0]

    scores, weight = scheduler.prioritize(to_schedule(pod("g", {"memory": 4})), [n.api.nodes[NODE], other])
    # node-b: 10 GiB used, c's 8 and f's 6 placed there (never counted: no kubelet runs it), g's 4: 28 of 80
    assert scores == {NODE: 0, OTHER: 4} and weight == 1


def test_its_http_answers_bad_calls_in_one_line_and_what_it_serves(cluster):
    n, scheduler, url = cluster

    def post(path: str, body: bytes) -> tuple[int, Any]:
        req = urllib.request.Request(url + path, data=body, method="POST", headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    code, out = post("/filter", b"{not json")
    assert code == 200 and out["Error"].startswith("the request is not an ExtenderArgs")
    code, out = post("/prioritize", b"[]")
    assert code == 400 and "not an ExtenderArgs" in out["error"]
    code, out = post("/bind", b"{}")
    assert code == 404 and out["error"] == "no verb 'bind' (accepted: filter, prioritize)"
    # kube-scheduler's own reading of a failed filter: the Error, as it would log it
    cache_capable = Scheduler(scheduler.url_prefix, scheduler.managed_resources, node_cache_capable=True)
    with pytest.raises(ExtenderError, match="set nodeCacheCapable: false"):
        cache_capable.filter(to_schedule(pod("p", {"memory": 1})), [n.api.nodes[NODE]])


def test_a_bad_listen_address_is_refused_in_one_line():
    r = subprocess.run([sys.executable, "-m", "gpuslice.cli", "scheduler-extender", "--listen", "localhost"],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2
    assert "'localhost' (accepted: HOST:PORT, the port from 1 to 65535)" in r.stderr

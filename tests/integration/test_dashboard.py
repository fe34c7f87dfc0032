"""The chart's Grafana dashboard against a real Prometheus (Debian 12's)
scraping a daemon on the simulator with slices under load: every panel's
expression, and every variable's, returns data through Prometheus's HTTP API,
labelled by the workload's namespace, pod and container. A query naming a
metric the daemon does not export returns nothing, and fails."""

from __future__ import annotations

import json
import re
import time

import pytest

from gpuslice.cli.sim_daemon import free_port
from gpuslice.proto import gpuslice_pb2 as pb
from tests.harness import interposer_env
from tests.harness.helm import CHART
from tests.harness.machine import Agent, GiB, gpu, needs_root
from tests.harness.prometheus import Prometheus

pytestmark = needs_root  # slices bound to processes in their own namespaces, as containers
DASHBOARD = json.loads((CHART / "dashboards" / "gpuslice.json").read_text())
# Grafana's variables, as a user with every value selected has them
VARIABLES = {"$node": ".*", "$namespace": ".*", "$pod": ".*", "$__rate_interval": "10s"}
LABEL_VALUES = re.compile(r"^label_values\((?P<expr>.+),\s*(?P<label>\w+)\)$")


def grafana(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def panel_queries(dashboard: dict) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dashboard["panels"] if p["type"] != "row" for t in p["targets"]]


def empty_queries(prom: Prometheus, dashboard: dict) -> list[str]:
    """The panels whose query returns no series, and the variables that find no value."""
    empty = [title for title, expr in panel_queries(dashboard) if not prom.query(grafana(expr))]
    for v in dashboard["templating"]["list"]:
        m = LABEL_VALUES.match(v.get("definition", ""))
        if v["type"] == "query" and m:
            values = {s["metric"].get(m["label"], "") for s in prom.query(grafana(m["expr"]))}
            if not values - {""}:
                empty.append(f"variable {v['name']}")
    return empty


@pytest.fixture
def loaded(daemon, containers, tmp_path):
    """A daemon whose two slices work: a hard 30 % share launching kernels
    (throttled), and a 1 GiB slice asked for more than its limit (refused)."""
    port = free_port()
    d = daemon([gpu("16Gi")], metrics={"port": port})
    client, env, agents = d.client(), interposer_env(d), []
    for name, notes, who in (
        ("trainer", {"gpuslice.io/memory": "4Gi", "gpuslice.io/cores": "30", "gpuslice.io/compute-policy": "hard"},
         pb.Workload(namespace="team-a", pod="trainer-0", container="main")),
        ("notebook", {"gpuslice.io/memory": "1Gi"}, pb.Workload(namespace="team-b", pod="nb-0", container="lab")),
    ):  # fmt: skip
        box = containers()
        client.reserve(name, notes, workload=who)
        client.bind(name, box.init_pid)
        agent = Agent(env, prefix=box.command([]))
        agents.append(agent)
        assert agent.call("init")["error"] == "CUDA_SUCCESS"
    trainer, notebook = agents
    assert trainer.call("alloc", path="mem", size=GiB)["error"] == "CUDA_SUCCESS"
    assert notebook.call("alloc", path="mem", size=2 * GiB)["error"] == "CUDA_ERROR_OUT_OF_MEMORY"
    trainer.call("launch_for", seconds=8.0)
    prom = Prometheus(tmp_path, [f"127.0.0.1:{port}"], interval=0.5)
    yield prom
    prom.close()
    for a in agents:
        a.close()


def test_every_dashboard_query_returns_data_from_a_real_prometheus(loaded):
    deadline = time.monotonic() + 30
    missing = ["not yet asked"]
    while missing and time.monotonic() < deadline:
        time.sleep(1)
        missing = empty_queries(loaded, DASHBOARD) if loaded.targets_up() else ["target not up"]
    assert not missing, f"no data for {missing}"
    # by workload, as people look for it
    got = loaded.query(grafana(dict(panel_queries(DASHBOARD))["Memory limit"]))
    assert {
        (s["metric"]["namespace"], s["metric"]["pod"], s["metric"]["container"], float(s["value"][1])) for s in got
    } == {("team-a", "trainer-0", "main", 4 * GiB), ("team-b", "nb-0", "lab", GiB)}
    refused = loaded.query('gpuslice_slice_oom_refusals_total{pod="nb-0"}')
    assert [float(s["value"][1]) for s in refused] == [1.0]
    throttled = loaded.query('gpuslice_slice_throttled_launches_total{pod="trainer-0"}')
    assert throttled and float(throttled[0]["value"][1]) > 0
    # a query naming a metric the daemon does not export finds nothing, and the check says which
    broken = json.loads(json.dumps(DASHBOARD))
    broken["panels"][-1]["targets"][0]["expr"] = 'sum(gpuslice_slice_no_such_metric{node=~"$node"})'
    assert empty_queries(loaded, broken) == [broken["panels"][-1]["title"]]

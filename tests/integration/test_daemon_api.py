"""The daemon on the simulator, driven through its gRPC client."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuslice import errors
from gpuslice.allocator.slice_files import SliceFiles
from gpuslice.cli.sim_daemon import free_port
from gpuslice.proto import gpuslice_pb2 as pb
from tests.harness.machine import GiB, gpu

MEM = "gpuslice.io/memory"
CORES = "gpuslice.io/cores"
GPUS = "gpuslice.io/gpus"
DEVICE = "gpuslice.io/device"


def code_of(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code(), e.value.details()


def test_fractional_slices_go_best_fit(daemon):
    c = daemon().client()
    assert c.reserve("a", {MEM: "10Gi", CORES: "20"}).gpus[0].index == 0
    # GPU 0 has 6 GiB left, GPU 1 16: the tighter fit wins, the big hole stays
    assert c.reserve("b", {MEM: "4Gi", CORES: "20"}).gpus[0].index == 0
    assert c.reserve("c", {MEM: "8Gi", CORES: "20"}).gpus[0].index == 1
    assert c.reserve("d", {MEM: "25%"}).gpus[0].memory_limit == 4 * GiB
    inv = {g.index: g for g in c.inventory().gpus}
    assert inv[0].memory_reserved == 14 * GiB and inv[0].cores_reserved == 40 and inv[0].slices == 2


def test_whole_and_multi_gpu_requests_are_all_or_nothing(daemon):
    c = daemon([gpu("16Gi")] * 4).client()
    c.reserve("small", {MEM: "1Gi", CORES: "10", DEVICE: "3"})
    code, msg = code_of(lambda: c.reserve("four", {GPUS: "4"}))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "GPU 3 (GPU-" in msg and "free" in msg and "\n" not in msg
    assert [s.container_id for s in c.list()] == ["small"]  # nothing half-reserved
    three = c.reserve("three", {GPUS: "3"})
    assert sorted(g.index for g in three.gpus) == [0, 1, 2] and three.whole
    code, _ = code_of(lambda: c.reserve("more", {MEM: "1Gi", DEVICE: "0"}))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED  # whole GPUs take no company


def test_multi_gpu_prefers_the_closest_gpus(daemon):
    topo = [
        {"gpus": [0, 1], "pcie": "system", "nvlinks": 0},
        {"gpus": [1, 2], "pcie": "system", "nvlinks": 0},
        {"gpus": [2, 3], "pcie": "system", "nvlinks": 0},
        {"gpus": [0, 3], "pcie": "system", "nvlinks": 0},
        {"gpus": [0, 2], "pcie": "hostbridge", "nvlinks": 0},
        {"gpus": [1, 3], "pcie": "single", "nvlinks": 4},
    ]
    c = daemon([gpu("16Gi")] * 4, topology=topo).client()
    first = c.reserve("pair1", {GPUS: "2"})
    assert sorted(g.index for g in first.gpus) == [1, 3]  # NVLink
    second = c.reserve("pair2", {GPUS: "2"})
    assert sorted(g.index for g in second.gpus) == [0, 2]  # same host bridge
    links = {(link.a, link.b): (link.pcie, link.nvlinks) for link in c.inventory().links}
    assert links[(1, 3)] == ("single", 1) and links[(0, 2)] == ("hostbridge", 0)


def test_numa_bind_takes_a_slice_s_gpus_from_one_numa_node_as_nvml_places_them(daemon):
    """gpuslice.io/numa-bind (what the webhook writes for HAMi's nvidia.com/numa-bind): two sockets,
    GPUs 0-1 and 2-3 each on one NUMA node by NVML's common ancestor ("node"), "system" across,
    GPUs 1 and 2 joined by NVLink. Without it a pair is the closest (the NVLinked one, across
    the sockets); with it the pair is one node's, and where no node has a pair free it waits
    (RESOURCE_EXHAUSTED) rather than being split, reserving nothing."""
    topo = [{"gpus": [0, 1], "pcie": "node", "nvlinks": 0}, {"gpus": [2, 3], "pcie": "node", "nvlinks": 0},
            {"gpus": [1, 2], "pcie": "system", "nvlinks": 4}]  # fmt: skip
    c = daemon([gpu("16Gi")] * 4, topology=topo).client()
    closest = c.reserve("closest", {GPUS: "2", MEM: "1Gi"})
    assert sorted(g.index for g in closest.gpus) == [1, 2]
    c.release("closest")
    bound = c.reserve("bound", {GPUS: "2", MEM: "2Gi", "gpuslice.io/numa-bind": "true"})
    mine = sorted(g.index for g in bound.gpus)
    assert mine in ([0, 1], [2, 3])
    other = c.reserve("other", {GPUS: "2", MEM: "15Gi", "gpuslice.io/numa-bind": "true"})  # no room beside it
    theirs = sorted(g.index for g in other.gpus)
    assert theirs == sorted({0, 1, 2, 3} - set(mine))
    c.release("other")
    # one GPU of each node with room for 10 GiB: a pair, but across the sockets
    c.reserve("hold-mine", {MEM: "13Gi", DEVICE: str(mine[0])})
    c.reserve("hold-theirs", {MEM: "15Gi", DEVICE: str(theirs[0])})
    before = {s.container_id for s in c.list()}
    code, msg = code_of(lambda: c.reserve("split", {GPUS: "2", MEM: "10Gi", "gpuslice.io/numa-bind": "true"}))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "on one NUMA node (gpuslice.io/numa-bind)" in msg, msg
    assert {s.container_id for s in c.list()} == before
    assert sorted(g.index for g in c.reserve("apart", {GPUS: "2", MEM: "10Gi"}).gpus) == [mine[1], theirs[1]]
    code, msg = code_of(lambda: c.reserve("three", {GPUS: "3", "gpuslice.io/numa-bind": "true"}))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and msg.endswith("the most the node has on one is 2"), msg


def test_pinning_is_honoured_or_refused_with_a_reason(daemon):
    c = daemon().client()
    uuid1 = c.inventory().gpus[1].uuid
    assert c.reserve("p1", {MEM: "1Gi", DEVICE: "1"}).gpus[0].index == 1
    assert c.reserve("p2", {MEM: "1Gi", DEVICE: uuid1}).gpus[0].index == 1
    code, msg = code_of(lambda: c.reserve("p3", {MEM: "1Gi", DEVICE: "7"}))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "no GPU 7 on this node" in msg
    code, msg = code_of(lambda: c.reserve("p4", {MEM: "17Gi"}))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "more than any GPU holds" in msg


def test_a_gpu_type_or_a_gpu_to_avoid_chooses_among_the_nodes_gpus_and_nothing_is_left_reserved(daemon):
    """What the webhook writes for HAMi's use-gputype and nouse-gpuuuid in runtimeClass mode, as the
    hook hands it to the daemon: the slice lands on a GPU of that name though best fit chooses another."""
    c = daemon([gpu("16Gi", name="Sim A100-SXM4-16GB"), gpu("16Gi", name="Sim H100 16GB")]).client()
    uuid = {g.name: g.uuid for g in c.inventory().gpus}
    assert c.reserve("a100", {MEM: "8Gi", "gpuslice.io/device-type": "a100"}).gpus[0].uuid == uuid["Sim A100-SXM4-16GB"]
    # best fit would put 1 GiB on the fuller A100; the request avoids it, by type and then by UUID
    assert c.reserve("t", {MEM: "1Gi", "gpuslice.io/avoid-device-type": "A100"}).gpus[0].uuid == uuid["Sim H100 16GB"]
    avoid = {MEM: "1Gi", "gpuslice.io/avoid-device": uuid["Sim A100-SXM4-16GB"]}
    assert c.reserve("u", avoid).gpus[0].uuid == uuid["Sim H100 16GB"]
    before = {s.container_id for s in c.list()}
    code, msg = code_of(lambda: c.reserve("v", {MEM: "1Gi", "gpuslice.io/device-type": "V100"}))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "\n" not in msg
    assert msg.startswith("no GPU of this node is one the request may be given (GPU 0: Sim A100-SXM4-16GB, not of "
                          "gpuslice.io/device-type V100; GPU 1: Sim H100 16GB, not of"), msg  # fmt: skip
    assert {s.container_id for s in c.list()} == before


def test_a_request_to_be_spread_lands_on_the_emptiest_gpu_and_one_to_be_packed_on_the_fullest(daemon):
    """gpuslice.io/gpu-policy (what the webhook writes for HAMi's gpu-scheduler-policy): spread
    takes the emptiest GPU that fits, binpack (the default) the fullest."""
    c = daemon([gpu("16Gi"), gpu("16Gi"), gpu("16Gi")]).client()
    first = c.reserve("a", {MEM: "4Gi"}).gpus[0].index
    assert c.reserve("b", {MEM: "2Gi", "gpuslice.io/gpu-policy": "binpack"}).gpus[0].index == first
    spread = c.reserve("c", {MEM: "2Gi", "gpuslice.io/gpu-policy": "spread"}).gpus[0].index
    assert spread != first
    last = c.reserve("d", {MEM: "1Gi", "gpuslice.io/gpu-policy": "spread"}).gpus[0].index
    assert last not in (first, spread)  # the one GPU still empty
    code, msg = code_of(lambda: c.reserve("e", {MEM: "1Gi", "gpuslice.io/gpu-policy": "scatter"}))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert msg == 'annotation gpuslice.io/gpu-policy: "scatter" is not valid; accepted: binpack or spread'


@pytest.mark.parametrize(
    ("annotations", "fragment"),
    [
        ({MEM: "lots"}, 'annotation gpuslice.io/memory: "lots" is not valid'),
        ({CORES: "150"}, 'annotation gpuslice.io/cores: "150" is not valid'),
        ({GPUS: "-1"}, 'annotation gpuslice.io/gpus: "-1" is not valid'),
        ({"other": "x"}, "asks for no GPU"),
        ({MEM: "9" * 400}, "annotation gpuslice.io/memory: "),  # was INTERNAL: a float overflow
        ({GPUS: "\uff11\uff16"}, 'annotation gpuslice.io/gpus: "\\uff11\\uff16" is not valid'),  # was 16 GPUs
        ({MEM: "1\u0660\u0660\u0660"}, "annotation gpuslice.io/memory: "),  # was 1000 bytes
    ],
)
def test_bad_requests_reserve_nothing(daemon, annotations, fragment):
    c = daemon().client()
    code, msg = code_of(lambda: c.reserve("bad", annotations))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and fragment in msg
    assert c.list() == [] and all(g.memory_reserved == 0 for g in c.inventory().gpus)


def test_reserve_is_idempotent_and_release_too(daemon):
    c = daemon().client()
    one = c.reserve("x", {MEM: "2Gi"})
    assert c.reserve("x", {MEM: "2Gi"}).id == one.id
    code, _ = code_of(lambda: c.reserve("x", {MEM: "3Gi"}))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert c.release("x") is True
    assert c.release("x") is False
    code, _ = code_of(lambda: c.get("x"))
    assert code == grpc.StatusCode.NOT_FOUND
    assert all(g.memory_reserved == 0 for g in c.inventory().gpus)


def test_resize_when_capacity_allows(daemon):
    d = daemon([gpu("16Gi")])
    c = d.client()
    c.reserve("r", {MEM: "4Gi", CORES: "30"})
    c.reserve("other", {MEM: "8Gi", CORES: "30"})
    grown = c.resize("r", {MEM: "8Gi", CORES: "60"})
    assert grown.gpus[0].memory_limit == 8 * GiB and grown.gpus[0].cores == 60
    code, msg = code_of(lambda: c.resize("r", {MEM: "9Gi"}))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, msg
    # what is free beside the other slices is named (8 GiB and 70 cores: the other's 8 GiB and 30 are not)
    assert re.fullmatch(r"no room for the new size \(9\.0 GiB and 60 cores\) beside the other slices: "
                        r"GPU 0 \(GPU-[0-9a-f-]+\): 8\.0 GiB and 70 cores free", msg), msg  # fmt: skip
    code, _ = code_of(lambda: c.resize("r", {GPUS: "2"}))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    # the slice's shared ledger carries the new limit for its processes
    files = SliceFiles(d.slice_files_dir, grown.id)
    assert files.limits.gpu[0].memory_limit == 8 * GiB and files.limits.gpu[0].cores == 60


def test_bind_and_the_sweep_reclaims_gone_containers(daemon):
    c = daemon(reservation_timeout=1.0).client()
    sleeper = subprocess.Popen(["sleep", "30"])
    c.reserve("alive", {MEM: "1Gi"})
    bound = c.bind("alive", sleeper.pid)
    assert bound.state == "bound" and bound.pid == sleeper.pid
    assert bound.pid_ns == os.stat(f"/proc/{sleeper.pid}/ns/pid").st_ino
    code, _ = code_of(lambda: c.bind("alive", os.getpid()))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    code, _ = code_of(lambda: c.bind("nobody", os.getpid()))
    assert code == grpc.StatusCode.NOT_FOUND
    c.reserve("never-bound", {MEM: "1Gi"})
    sleeper.kill()
    sleeper.wait()
    deadline = time.monotonic() + 5
    while c.list() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert c.list() == []


def test_idle_connections_to_the_metrics_port_are_bounded_and_scrapes_go_on(daemon):
    """Anyone who reaches the metrics port may open connections and send nothing: past
    MAX_CONNECTIONS each is closed as it is accepted, so the daemon's threads stay bounded,
    and once they close a scrape is answered again."""
    from gpuslice.http_json import MAX_CONNECTIONS

    port = free_port()
    d = daemon(metrics={"port": port})
    idle = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(MAX_CONNECTIONS)]
    try:
        one_more = socket.create_connection(("127.0.0.1", port), timeout=30)
        assert one_more.recv(1) == b""  # accepted after the others (one accept loop) and closed at once
        one_more.close()
        threads = len(os.listdir(f"/proc/{d.proc.pid}/task"))
        assert threads < MAX_CONNECTIONS + 64, threads
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + 30
    while True:
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            break
        except OSError:  # the idle ones' threads have not all seen their end yet
            assert time.monotonic() < deadline, "no scrape answered after the idle connections closed"
            time.sleep(0.05)
    assert "gpuslice_reservations_total" in body


def test_health_metrics_and_status(daemon):
    port = free_port()
    d = daemon(metrics={"port": port})
    c = d.client()
    c.reserve(
        "m", {MEM: "3Gi", CORES: "25"}, workload=pb.Workload(namespace="team-a", pod="trainer-0", container="main")
    )
    with pytest.raises(grpc.RpcError):
        c.reserve("too-big", {MEM: "900Gi"})
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(body) for s in f.samples}  # fmt: skip
    [(name, labels)] = [k for k in samples if k[0] == "gpuslice_slice_memory_limit_bytes"]
    [sid] = [x.id for x in c.list()]
    assert dict(labels) == {"node": socket.gethostname(), "namespace": "team-a", "pod": "trainer-0",
                            "container": "main", "container_id": "m", "slice": sid, "gpu": "0"}  # fmt: skip
    assert samples[(name, labels)] == 3 * (1 << 30)
    assert 'gpuslice_gpu_memory_reserved_bytes{gpu="0",node=' in body
    assert samples[("gpuslice_reservations_total", (("kind", "container"), ("result", "ok")))] == 1
    # a claim's two shares of one GPU: one series for that GPU, the shares added up (as its slice files have it)
    c.reserve_claim("u2", [pb.Share(gpu_index=0, memory=GiB, cores=10, share_id="a"),
                           pb.Share(gpu_index=0, memory=2 * GiB, cores=20, share_id="b")])  # fmt: skip
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    claim = [s for f in text_string_to_metric_families(body) for s in f.samples
             if s.name == "gpuslice_slice_memory_limit_bytes" and s.labels["container_id"] == "claim-u2"]  # fmt: skip
    assert [(s.labels["gpu"], s.value) for s in claim] == [("0", 3 * GiB)]
    assert samples[("gpuslice_reservations_total", (("kind", "container"), ("result", "CannotFit")))] == 1
    assert 'gpuslice_rpc_total{code="OK",method="Reserve"} 1.0' in body
    assert "gpuslice_rpc_duration_seconds_bucket" in body
    # the compute controller looks only at slices with processes (docs/daemon.md, "Scale"): this one
    # has none, so it has no compute series yet (test_compute checks them for slices that run)
    time.sleep(0.3)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "gpuslice_slice_compute_target_ratio{" not in body
    ticks = [s.value for f in text_string_to_metric_families(body) for s in f.samples
             if s.name == "gpuslice_compute_tick_seconds_count"]  # fmt: skip
    assert ticks and ticks[0] >= 1  # it ticked at its start (and once a second while no slice has a process)
    out = subprocess.run(
        [sys.executable, "-m", "gpuslice.cli", "status", "--socket", str(d.socket)], capture_output=True, text=True
    )
    assert out.returncode == 0 and "m " in out.stdout and "3.0 GiB" in out.stdout
    js = subprocess.run(
        [sys.executable, "-m", "gpuslice.cli", "status", "--json", "--socket", str(d.socket)],
        capture_output=True,
        text=True,
    )
    assert '"container_id": "m"' in js.stdout


def test_bad_daemon_config_names_each_problem(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("socket: 5\nmetrics: {port: -1}\nnvml: gpu\nsurprise: 1\n")
    r = subprocess.run(
        [sys.executable, "-m", "gpuslice.cli", "daemon", "--config", str(cfg)], capture_output=True, text=True
    )
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert any("metrics.port" in line for line in lines)
    assert any(line.startswith(f"gpuslice daemon: config {cfg}: socket:") for line in lines)
    assert any("nvml:" in line for line in lines) and any("surprise" in line for line in lines)


def test_a_claim_is_reserved_share_by_share_each_of_its_own_size(daemon):
    """ReserveClaim: the shares the scheduler allocated, typed (no annotation
    strings), each its own size, policy and priority, booked on their GPUs; a
    kind of its own with no files (its containers charge ledgers of the shares
    they were given, tests/integration/test_hook.py), kept as the daemon's
    error kinds through the client."""
    d = daemon([gpu("16Gi"), gpu("16Gi")])
    c = d.client()
    shares = [
        pb.Share(gpu_index=0, memory=8 * GiB, cores=60, policy="hard", share_id="a"),
        pb.Share(gpu_index=1, memory=2 * GiB, cores=50, share_id="b"),
        pb.Share(gpu_index=0, memory=1 * GiB, cores=10, priority="low", share_id="c"),
    ]
    s = c.reserve_claim("u1", shares, owner="dra ml/train")
    assert (s.container_id, s.kind, s.state) == ("claim-u1", "claim", "reserved")
    assert [(g.index, g.memory_limit, g.cores, g.share_id, g.policy, g.priority) for g in s.gpus] == [
        (0, 8 * GiB, 60, "a", "hard", "normal"),
        (0, 1 * GiB, 10, "c", "elastic", "low"),
        (1, 2 * GiB, 50, "b", "elastic", "normal"),
    ]
    assert [(g.memory_reserved, g.cores_reserved) for g in c.inventory().gpus] == [(9 * GiB, 70), (2 * GiB, 50)]
    assert not list(d.slice_files_dir.glob(f"{s.id}.*"))  # no ledger until a container is given its shares
    assert c.reserve_claim("u1", shares).id == s.id  # the kubelet asks again: the same slice
    with pytest.raises(errors.FailedPrecondition, match="claim u1 already holds slice"):
        c.reserve_claim("u1", shares[:1])
    with pytest.raises(errors.ResourceExhausted) as full:  # the daemon's kind, through the client
        c.reserve_claim("u2", [pb.Share(gpu_index=0, memory=8 * GiB)])
    assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "no room for 8.0 GiB" in str(full.value)
    with pytest.raises(errors.InvalidArgument, match="policy 'strict'"):
        c.reserve_claim("u3", [pb.Share(gpu_index=1, memory=GiB, policy="strict")])
    with pytest.raises(errors.InvalidArgument, match="no GPU 5 on this node"):
        c.reserve_claim("u4", [pb.Share(gpu_index=5, memory=GiB)])
    with pytest.raises(errors.FailedPrecondition, match="is a claim slice"):
        c.resize("claim-u1", {MEM: "1Gi"})
    assert [x.container_id for x in c.list()] == ["claim-u1"]  # nothing half-reserved by the refusals
    assert c.release("claim-u1") and [(g.memory_reserved, g.cores_reserved) for g in c.inventory().gpus] == [
        (0, 0),
        (0, 0),
    ]

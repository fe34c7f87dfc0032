"""The device plugin against the real contracts: a stand-in kubelet device
manager over the kubelet's own protos (registration on kubelet.sock,
ListAndWatch, GetPreferredAllocation then Allocate per container per resource
in Go map order, its checkpoint, the pod-resources service), pods served by a
stand-in API server, and the daemon on the simulator holding the slices."""

from __future__ import annotations

import signal
import stat
import threading
import time

import pytest

from gpuslice.device_plugin import units as u
from tests.harness.device_plugin import DevicePluginNode, pod
from tests.harness.machine import gpu

GiB = 1 << 30


@pytest.fixture
def node(daemon, tmp_path):
    n = DevicePluginNode.running(daemon([gpu("16Gi"), gpu("16Gi")]), tmp_path)
    yield n
    n.close()


def booked(n: DevicePluginNode) -> dict[str, tuple[str, int, int]]:
    """Each allocation's (GPU, memory GiB, cores)."""
    return {k: (s.gpus[0].uuid, s.gpus[0].memory_limit // GiB, s.gpus[0].cores) for k, s in n.allocations().items()}


def test_a_pod_gets_memory_and_cores_on_one_gpu_and_the_kubelet_counts_the_units(node):
    s = node.state_of()
    assert s["allocatable"] == {u.MEMORY: 32, u.CORES: 200, u.GPU: 2}
    p = pod("a", {"memory": 8, "cores": 30})
    assert node.admit(p) == {"admitted": True}
    held = booked(node)
    assert sorted((m, c) for _, m, c in held.values()) == [(0, 30), (8, 0)]
    assert len({g for g, _, _ in held.values()}) == 1
    opts = node.options(p)
    assert len(opts["cdi_devices"]) == 1 and opts["cdi_devices"][0].startswith("gpuslice.io/gpu=GPU-")
    assert sorted(v.split("/")[1] for v in opts["envs"].values()) == ["cores", "memory"]


def test_a_whole_gpu_unit_names_its_gpu_s_numa_node_and_a_slice_s_units_name_none(daemon, tmp_path):
    """Each gpuslice.io/gpu unit's topology is the NUMA node sysfs gives its GPU
    (/sys/bus/pci/devices/<bus ID>/numa_node, by the bus ID NVML reports), so that the
    kubelet's Topology Manager aligns a container's whole GPUs (HAMi's numa-bind, under
    single-numa-node); a GPU sysfs names no node for (-1, as on one socket) gets none, and
    the memory and cores units none: a slice lies on one GPU, and no alignment policy may
    refuse a slice whose GPU the plugin chose."""
    buses = ("00000000:3B:00.0", "00000000:AF:00.0", "00000000:D8:00.0")
    sysfs = tmp_path / "sys"
    for bus, node in zip(("0000:3b:00.0", "0000:af:00.0", "0000:d8:00.0"), ("0", "1", "-1"), strict=True):
        (sysfs / "bus" / "pci" / "devices" / bus).mkdir(parents=True)
        (sysfs / "bus" / "pci" / "devices" / bus / "numa_node").write_text(node + "\n")
    d = daemon([gpu("16Gi", pci_bus_id=b) for b in buses])
    n = DevicePluginNode(d, tmp_path)
    n.plugin_args = ["--sysfs", str(sysfs)]
    try:
        n.start_kubelet()
        n.start_plugin()
        topology = n.wait_registered()["topology"]
        uuid = {g.pci_bus_id: g.uuid for g in d.client().inventory().gpus}
        assert {u.parse(i).gpu: nodes for i, nodes in topology[u.GPU].items()} == {
            uuid[buses[0]]: [0], uuid[buses[1]]: [1]}  # fmt: skip
        assert topology[u.MEMORY] == {} and topology[u.CORES] == {}
    finally:
        n.close()


def test_a_container_asking_several_whole_gpus_gets_the_closest_set_on_one_numa_node(daemon, tmp_path):
    """gpuslice.io/gpu: 2 (HAMi's exclusive cards, two of them): GetPreferredAllocation answers two
    GPUs, not "must lie on one GPU" (the kubelet failed such a pod's admission with that line):
    the set that crosses NUMA nodes least, then the closest, as the daemon places a multi-GPU
    slice. Here GPUs 0-1 and 2-3 are each one NUMA node's and 1-2 NVLinked across the sockets:
    a pair of one node's, then the other pair; the kubelet then has none left to give."""
    topo = [{"gpus": [0, 1], "pcie": "node", "nvlinks": 0}, {"gpus": [2, 3], "pcie": "node", "nvlinks": 0},
            {"gpus": [1, 2], "pcie": "system", "nvlinks": 4}]  # fmt: skip
    d = daemon([gpu("16Gi")] * 4, topology=topo)
    n = DevicePluginNode.running(d, tmp_path)
    try:
        index = {g.uuid: g.index for g in d.client().inventory().gpus}
        pairs = []
        for name in ("a", "b"):
            p = pod(name, {"gpu": 2})
            assert n.admit(p) == {"admitted": True}, n.log()
            [(_, ids)] = n.state_of()["pod_devices"][p["metadata"]["uid"]]["c0"].items()
            pairs.append(sorted(index[u.parse(i).gpu] for i in ids["ids"]))
        assert sorted(pairs) == [[0, 1], [2, 3]]
        assert sorted(s.gpus[0].index for s in n.allocations().values()) == [0, 1, 2, 3]  # each held whole
        out = n.admit(pod("c", {"gpu": 1}))
        assert out["admitted"] is False and "requested number of devices unavailable" in out["message"], out
    finally:
        n.close()


def wait_for(what, seconds: float = 15):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not (found := what()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return found


def allocatable(n: DevicePluginNode) -> dict[str, int]:
    return n.state_of()["allocatable"]


def test_a_gpu_given_whole_leaves_the_counts_and_a_sliced_gpu_is_not_given_whole(node):
    a = pod("a", {"memory": 4, "cores": 10})
    assert node.admit(a)["admitted"]
    sliced = next(iter(booked(node).values()))[0]
    wait_for(lambda: allocatable(node)[u.GPU] == 1)  # the sliced GPU's whole unit is off the count
    b = pod("b", {"gpu": 1})
    assert node.admit(b)["admitted"]
    whole = [g for g, _, _ in booked(node).values() if g != sliced]
    assert len(whole) == 1
    wait_for(lambda: allocatable(node) == {u.MEMORY: 16, u.CORES: 100, u.GPU: 1})
    assert not node.admit(pod("c", {"gpu": 1}))["admitted"]  # the sliced one is not given whole


@pytest.mark.parametrize("seed", [0, 1, 2, 3])  # the kubelet's map order: memory or cores first
def test_a_pod_that_fits_the_node_but_no_single_gpu_is_refused_at_admission_in_one_line(daemon, tmp_path, seed):
    n = DevicePluginNode(daemon([gpu("16Gi"), gpu("16Gi")]), tmp_path, seed=seed)
    n.start_kubelet()
    n.start_plugin()
    try:
        n.wait_registered()
        assert n.admit(pod("a", {"memory": 6, "cores": 95}))["admitted"]  # GPU X: 10 GiB and 5 cores left
        assert n.admit(pod("b", {"memory": 10, "cores": 10}))["admitted"]  # X has no 10 cores: GPU Y
        before = booked(n)
        x, y = booked_gpus(before)
        out = n.admit(pod("c", {"memory": 8, "cores": 50}))  # the node has 16 GiB and 95 cores free
        assert out["admitted"] is False and out["reason"] == "UnexpectedAdmissionError"
        line = out["message"]
        assert "\n" not in line
        assert "container default/c/c0 asks 50 gpuslice.io/cores and 8 gpuslice.io/memory on one GPU" in line
        assert f"{x} has 5 cores and 10 memory" in line and f"{y} has 90 cores and 6 memory" in line
        time.sleep(0.5)
        assert booked(n) == before  # nothing booked for it, nothing lost
        assert n.admit(pod("d", {"memory": 8, "cores": 5}))["admitted"]  # what fits X still goes there
        assert {g for g, _, _ in booked(n).values()} == {x, y}
    finally:
        n.close()


def booked_gpus(held: dict[str, tuple[str, int, int]]) -> tuple[str, str]:
    """The GPU with the most cores booked, then the other."""
    cores: dict[str, int] = {}
    for g, _, c in held.values():
        cores[g] = cores.get(g, 0) + c
    x = max(cores, key=lambda g: cores[g])
    return x, next(g for g in cores if g != x)


def test_a_containers_gpu_choice_is_held_by_the_plugin_whichever_gpu_is_fuller(daemon, tmp_path):
    """HAMi's use-gputype as the webhook writes it (the container's GPUSLICE_DEVICE_TYPE): the plugin
    gives units only on a GPU whose name holds the word, though binpacking alone would choose the other."""
    n = DevicePluginNode.running(daemon([gpu("16Gi", name="Sim A100-SXM4-16GB"), gpu("16Gi", name="Sim H100 16GB")]),
                                 tmp_path)  # fmt: skip
    try:
        gpus = {g.name: g.uuid for g in n.d.client().inventory().gpus}
        a100, h100 = gpus["Sim A100-SXM4-16GB"], gpus["Sim H100 16GB"]
        assert n.admit(pod("first", {"memory": 4}, env={"GPUSLICE_DEVICE_TYPE": "a100"}))["admitted"]
        assert {g for g, _, _ in booked(n).values()} == {a100}
        # binpack would put it on the A100, which holds a slice; the choice says the H100
        assert n.admit(pod("second", {"memory": 4, "cores": 20}, env={"GPUSLICE_AVOID_DEVICE_TYPE": "A100"}))[
            "admitted"
        ]
        second = {k: v for k, v in booked(n).items() if v[0] != a100}
        assert sorted(second.values()) == [(h100, 0, 20), (h100, 4, 0)]
        before = booked(n)
        none = n.admit(pod("third", {"memory": 1}, env={"GPUSLICE_DEVICE_TYPE": "V100"}))
        assert none["admitted"] is False and "\n" not in none["message"]
        assert "container default/third/c0 may be given none of this node's GPUs" in none["message"]
        assert f"{a100}: Sim A100-SXM4-16GB, not of gpuslice.io/device-type V100" in none["message"]
        out = n.admit(pod("fourth", {"memory": 4}, env={"GPUSLICE_DEVICE_TYPE": "A100;x"}))
        assert out["admitted"] is False and 'GPUSLICE_DEVICE_TYPE: "A100;x" is not valid' in out["message"]
        assert booked(n) == before  # nothing booked for the refused
    finally:
        n.close()


def test_a_container_whose_gpu_policy_is_spread_gets_the_emptiest_gpu(daemon, tmp_path):
    """HAMi's gpu-scheduler-policy: spread as the webhook writes it (the container's
    GPUSLICE_GPU_POLICY): the plugin gives units on the emptiest GPU that fits, where binpacking
    (the default, and a container that says binpack) fills the fuller one first."""
    n = DevicePluginNode.running(daemon([gpu("16Gi"), gpu("16Gi")]), tmp_path)
    try:
        assert n.admit(pod("first", {"memory": 4}))["admitted"]
        [fuller] = {g for g, _, _ in booked(n).values()}
        assert n.admit(pod("packed", {"memory": 4}, env={"GPUSLICE_GPU_POLICY": "binpack"}))["admitted"]
        assert {g for g, _, _ in booked(n).values()} == {fuller}
        assert n.admit(pod("spread", {"memory": 2, "cores": 10}, env={"GPUSLICE_GPU_POLICY": "spread"}))["admitted"]
        spread = {v for v in booked(n).values() if v[0] != fuller}
        assert len(spread) == 2 and {c for _, _, c in spread} == {0, 10}  # memory and cores, on the other GPU
        out = n.admit(pod("bad", {"memory": 1}, env={"GPUSLICE_GPU_POLICY": "scatter"}))
        assert out["admitted"] is False and 'GPUSLICE_GPU_POLICY: "scatter" is not valid' in out["message"]
    finally:
        n.close()


def test_a_whole_gpu_is_given_where_its_containers_choice_lets_it(daemon, tmp_path):
    n = DevicePluginNode.running(daemon([gpu("16Gi", name="Sim A100"), gpu("16Gi", name="Sim H100")]), tmp_path)
    try:
        gpus = sorted((g.uuid, g.name) for g in n.d.client().inventory().gpus)
        last, last_name = gpus[-1]  # with both idle and no choice, the plugin takes the first by UUID
        assert n.admit(pod("w", {"gpu": 1}, env={"GPUSLICE_DEVICE_TYPE": last_name.split()[1]}))["admitted"]
        assert [g for g, _, _ in booked(n).values()] == [last]
        out = n.admit(pod("v", {"gpu": 1}, env={"GPUSLICE_DEVICE": str(next(
            g.index for g in n.d.client().inventory().gpus if g.uuid == last))}))  # fmt: skip
        assert out["admitted"] is False and "asks 1 whole GPUs; 0 free it may be given" in out["message"]
    finally:
        n.close()


def test_two_pods_of_several_containers_each_get_slices_on_one_gpu_each(node):
    p = pod("multi", ("main", {"memory": 4, "cores": 40}), ("side", {"memory": 2}))
    q = pod("other", ("main", {"memory": 12, "cores": 60}))
    assert node.admit(p)["admitted"] and node.admit(q)["admitted"]
    for who, container in ((p, "main"), (p, "side"), (q, "main")):
        opts = node.options(who, container)
        keys = [v.split("/")[0] for v in opts["envs"].values()]
        gpus = {node.allocations()[k].gpus[0].uuid for k in keys}
        assert len(gpus) == 1 and opts["cdi_devices"] == [f"gpuslice.io/gpu={gpus.pop()}"]


def test_a_deleted_pods_allocations_are_released_within_seconds(node):
    p = pod("a", {"memory": 8, "cores": 30})
    assert node.admit(p)["admitted"]
    assert len(node.allocations()) == 2
    time.sleep(5.5)  # older than a just-made allocation the kubelet may not have recorded yet
    node.delete(p)
    start = time.monotonic()
    wait_for(lambda: not node.allocations(), 10)
    assert time.monotonic() - start < 3
    assert "released allocation" in node.log()


def test_a_kubelet_restart_is_followed_by_registration_and_nothing_is_lost(node):
    p = pod("a", {"memory": 8, "cores": 30})
    assert node.admit(p)["admitted"]
    before = booked(node)
    node.stop_kubelet()
    node.start_kubelet()  # a new kubelet.sock; our sockets removed
    node.wait_registered()
    time.sleep(1.0)  # several reconciles
    assert booked(node) == before
    assert node.options(p)["envs"]  # the kubelet's checkpoint kept the answer
    assert node.admit(pod("b", {"memory": 8}))["admitted"]
    assert "registered gpuslice.io/memory" in node.log()


def test_a_plugin_restart_keeps_the_books_and_registers_again(node):
    p = pod("a", {"memory": 8, "cores": 30})
    assert node.admit(p)["admitted"]
    before = booked(node)
    since = node.state_of()["updates"]
    node.stop_plugin(signal.SIGKILL)
    node.start_plugin()
    node.wait_registered(since=since)
    assert booked(node) == before
    assert node.admit(pod("b", {"memory": 8, "cores": 70}))["admitted"]
    assert len(booked(node)) == 4


def test_a_plugin_killed_mid_allocation_leaves_nothing_booked(node):
    """The daemon stopped while the plugin waits on it; the plugin is killed;
    the daemon then finishes the booking that no one will use. The kubelet
    rejects the pod (Allocate failed), and the plugin restarted releases it."""
    node.d.proc.send_signal(signal.SIGSTOP)
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(node.admit(pod("a", {"memory": 8}))))
    t.start()
    time.sleep(1.0)
    node.stop_plugin(signal.SIGKILL)
    node.d.proc.send_signal(signal.SIGCONT)
    t.join(60)
    assert result["admitted"] is False
    since = node.state_of()["updates"]
    node.start_plugin()
    node.wait_registered(since=since)
    wait_for(lambda: not node.allocations(), 15)
    assert node.admit(pod("b", {"memory": 16}))["admitted"]  # the whole GPU's memory is there to take


def test_an_unhealthy_gpu_has_its_units_unhealthy(daemon, tmp_path):
    n = DevicePluginNode(daemon([gpu("16Gi"), gpu("16Gi", ecc_uncorrected=2)]), tmp_path)
    n.start_kubelet()
    n.start_plugin()
    try:
        assert n.wait_registered()["allocatable"] == {u.MEMORY: 16, u.CORES: 100, u.GPU: 1}
        assert n.state_of()["capacity"] == {u.MEMORY: 32, u.CORES: 200, u.GPU: 2}
    finally:
        n.close()


def test_its_sockets_are_for_root_alone_whatever_umask_it_inherits(daemon, tmp_path):
    """Whoever reaches a DevicePlugin socket can Allocate (book GPU memory) at will."""
    n = DevicePluginNode(daemon(), tmp_path)
    n.start_kubelet()
    n.start_plugin(umask=0)
    try:
        n.wait_registered()
        sockets = sorted(n.dir.glob("gpuslice-*.sock"))
        assert len(sockets) == 3
        assert {stat.S_IMODE(s.stat().st_mode) for s in sockets} == {0o600}
    finally:
        n.close()

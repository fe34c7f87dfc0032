"""The DRA driver's pure parts: versions as DRA takes them, GPU groups for
placement, quantities, and the opaque configuration's precedence."""

from __future__ import annotations

import re

import pytest

from gpuslice.dra import claims, resource_slice
from gpuslice.proto import gpuslice_pb2 as pb


def test_versions_become_semantic_versions():
    assert resource_slice.semver("580.95.05") == "580.95.5"
    assert resource_slice.semver("9.0") == "9.0.0"
    assert resource_slice.semver("12") == "12.0.0"


def test_gpus_are_grouped_by_host_bridge_by_nvlink_and_by_numa_node():
    inv = pb.InventoryReply(
        gpus=[pb.Gpu(index=i, uuid=f"GPU-{i}", memory_total=80 << 30) for i in range(4)],
        links=[pb.Link(a=0, b=1, pcie="hostbridge", nvlinks=1), pb.Link(a=2, b=3, pcie="single", nvlinks=0),
               pb.Link(a=0, b=2, pcie="system"), pb.Link(a=1, b=3, pcie="node")],
        driver_version="580.95.05",
    )  # fmt: skip
    devices = resource_slice.build("n", inv, 1)["spec"]["devices"]
    roots = [d["attributes"]["pcieRoot"]["int"] for d in devices]
    domains = [d["attributes"]["nvlinkDomain"]["int"] for d in devices]
    assert roots == [0, 0, 2, 2] and domains == [0, 0, 2, 3]
    # "node": one NUMA node, under two host bridges; "system": across the sockets (numa-bind's constraint)
    assert [d["attributes"]["numaGroup"]["int"] for d in devices] == [0, 0, 0, 0]  # 0-1, 1-3 and 3-2 near
    inv.links.append(pb.Link(a=2, b=3, pcie="system"))
    del inv.links[1]  # 2 apart from each: its own
    assert [d["attributes"]["numaGroup"]["int"] for d in resource_slice.build("n", inv, 1)["spec"]["devices"]] == [
        0,
        0,
        2,
        0,
    ]


@pytest.mark.parametrize(("text", "value"), [("4Gi", 4 << 30), ("30", 30), ("1500M", 1_500_000_000), (4096, 4096)])
def test_whole_quantities(text, value):
    assert claims.quantity(text, "memory") == value


@pytest.mark.parametrize("text", ["1.5Gi", "500m", "-1", "4 Gi", "\uff14Gi"])  # the last: a fullwidth digit
def test_other_quantities_are_one_line_errors(text):
    with pytest.raises(claims.ClaimError, match="not a whole quantity"):
        claims.quantity(text, "memory")


def _result(request: str = "r", device: str = "gpu-0", **extra: object) -> dict:
    consumed = {"memory": "1Gi", "cores": "10"}
    return {"request": request, "driver": "gpuslice.io", "pool": "n", "device": device,
            "consumedCapacity": consumed, "shareID": f"{request}-{device}", **extra}  # fmt: skip


def _claim(config: list, results: list[dict] | None = None) -> dict:
    return {
        "metadata": {"uid": "u", "namespace": "ns", "name": "c"},
        "status": {"allocation": {"devices": {"results": results or [_result()], "config": config}}},
    }


def _opaque(source: str, requests: list[str] | None = None, **params: object) -> dict:
    return {"source": source, **({"requests": requests} if requests else {}),
            "opaque": {"driver": "gpuslice.io", "parameters": {"apiVersion": "gpuslice.io/v1", **params}}}  # fmt: skip


def test_the_claims_configuration_wins_over_its_class():
    parsed = claims.parse(_claim([_opaque("FromClaim", computePolicy="hard"),
                                  _opaque("FromClass", computePolicy="elastic", priority="low")]), "n")  # fmt: skip
    (r,) = parsed.results
    assert (r.config.policy, r.config.priority) == ("hard", "low")
    assert r.memory == 1 << 30 and r.cores == 10 and r.share == "r-gpu-0"


def test_each_config_entry_applies_to_the_requests_it_names():
    """kube-scheduler's one claim, two requests: each result gets the entries
    that name its request (or none), never another request's."""
    results = [_result("big", "gpu-0"), _result("small", "gpu-1"), _result("mon/any", "gpu-1")]
    config = [
        _opaque("FromClass", priority="low"),
        _opaque("FromClaim", ["big"], computePolicy="hard", priority="high"),
        _opaque("FromClaim", ["small"], wholeGPU=True),
        _opaque("FromClaim", ["mon"], computePolicy="hard"),
    ]
    big, small, mon = claims.parse(_claim(config, results), "n").results
    assert big.config == claims.Config("hard", "high", False)
    assert small.config == claims.Config(None, "low", True)
    assert mon.config == claims.Config("hard", "low", False)  # a subrequest takes its parent's entries
    assert (mon.request, mon.base_request) == ("mon/any", "mon")  # the kubelet matches containers by the parent


def test_admin_access_is_read_and_a_result_without_capacity_is_the_whole_device():
    admin = _result("watch", "gpu-0", adminAccess=True)
    exclusive = {k: v for k, v in _result("old", "gpu-1").items() if k not in ("consumedCapacity", "shareID")}
    a, e = claims.parse(_claim([], [admin, exclusive]), "n").results
    assert a.admin and not e.admin
    assert (e.memory, e.cores, e.share_id, e.share) == (None, None, None, "old@gpu-1")


def test_one_request_given_one_gpu_twice_is_refused_in_one_line():
    """Kubernetes 1.34-1.35 give a `count: 2` request the same shared GPU twice."""
    twice = [_result("gpu", "gpu-0", shareID="a"), _result("gpu", "gpu-0", shareID="b")]
    with pytest.raises(claims.ClaimError, match=r"^request gpu was given GPU gpu-0 twice .* Kubernetes 1\.36"):
        claims.parse(_claim([], twice), "n")
    two_requests = [_result("a", "gpu-0"), _result("b", "gpu-0")]  # two requests on one GPU: as 1.36 allocates
    assert len(claims.parse(_claim([], two_requests), "n").results) == 2


def test_another_drivers_configuration_is_not_ours():
    other = {"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": {"sharing": "x"}}}
    assert claims.parse(_claim([other]), "n").results[0].config == claims.Config()


def test_unknown_configuration_is_refused_with_what_is_accepted():
    with pytest.raises(claims.ClaimError, match=re.escape("unknown ['sharing']; accepted: apiVersion gpuslice.io/v1")):
        claims.parse(_claim([_opaque("FromClaim", sharing="timeslice")]), "n")


def test_the_defaults_let_memory_only_claims_share_and_book_a_whole_gpu_otherwise():
    inv = pb.InventoryReply(
        gpus=[pb.Gpu(index=0, uuid="GPU-0", memory_total=(16 << 30) + (100 << 20))], driver_version="580.95.05"
    )
    (device,) = resource_slice.build("n", inv, 1)["spec"]["devices"]
    memory, cores = device["capacity"]["memory"], device["capacity"]["cores"]
    assert memory["value"] == memory["requestPolicy"]["default"] == str(16 << 30)  # rounded down to 256 MiB
    assert cores["requestPolicy"] == {"default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}}


def test_standard_pci_attributes_from_nvml_and_sysfs(tmp_path):
    assert resource_slice.pci_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert resource_slice.pci_bus_id("0001:0a:1f.7") == "0001:0a:1f.7"
    assert resource_slice.pci_bus_id("garbage") is None
    # sysfs as the kernel lays it out: the bus link resolves under the root complex
    device = tmp_path / "devices" / "pci0000:3a" / "0000:3a:00.0" / "0000:3b:00.0"
    device.mkdir(parents=True)
    bus = tmp_path / "bus" / "pci" / "devices"
    bus.mkdir(parents=True)
    (bus / "0000:3b:00.0").symlink_to("../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0")
    assert resource_slice.pcie_root("0000:3b:00.0", tmp_path) == "pci0000:3a"
    assert resource_slice.pcie_root("0000:99:00.0", tmp_path) is None  # not in sysfs: left out
    inv = pb.InventoryReply(gpus=[pb.Gpu(index=0, uuid="GPU-0", memory_total=16 << 30, pci_bus_id="00000000:3B:00.0"),
                                  pb.Gpu(index=1, uuid="GPU-1", memory_total=16 << 30, pci_bus_id="00000000:99:00.0")],
                            driver_version="580.95.05")  # fmt: skip
    a, b = (d["attributes"] for d in resource_slice.build("n", inv, 1, tmp_path)["spec"]["devices"])
    assert a["resource.kubernetes.io/pciBusID"] == {"string": "0000:3b:00.0"}
    assert a["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:3a"}
    assert b["resource.kubernetes.io/pciBusID"] == {"string": "0000:99:00.0"}
    assert "resource.kubernetes.io/pcieRoot" not in b


@pytest.mark.parametrize(("toleration", "tolerated"), [
    ({"key": "gpuslice.io/unhealthy", "operator": "Exists"}, True),
    ({"key": "gpuslice.io/unhealthy"}, True),  # Equal by default, the taint has no value
    ({"key": "gpuslice.io/unhealthy", "value": "x"}, False),
    ({"key": "gpuslice.io/unhealthy", "operator": "Exists", "effect": "NoExecute"}, False),
    ({"key": "gpuslice.io/unhealthy", "effect": "NoSchedule"}, True),
    ({"operator": "Exists"}, True),  # every key
    ({"key": "example.com/other", "operator": "Exists"}, False),
])  # fmt: skip
def test_a_request_tolerates_the_unhealthy_taint_as_device_tolerations_define(toleration, tolerated):
    assert claims.tolerates((toleration,), "gpuslice.io/unhealthy", "NoSchedule") is tolerated


def test_tolerations_are_read_where_each_api_version_keeps_them():
    claim = {"spec": {"devices": {"requests": [
        {"name": "a", "exactly": {"tolerations": [{"operator": "Exists"}]}},
        {"name": "b", "firstAvailable": [{"name": "big"}, {"name": "small", "tolerations": [{"key": "k"}]}]},
        {"name": "c", "tolerations": [{"key": "v1beta1"}]},
    ]}}}  # fmt: skip
    got = claims.request_tolerations(claim)
    assert got == {"a": ({"operator": "Exists"},), "b": (), "b/big": (), "b/small": ({"key": "k"},),
                   "c": ({"key": "v1beta1"},)}  # fmt: skip

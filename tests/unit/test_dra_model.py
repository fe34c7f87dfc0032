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


def test_gpus_are_grouped_by_host_bridge_and_by_nvlink():
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


@pytest.mark.parametrize(("text", "value"), [("4Gi", 4 << 30), ("30", 30), ("1500M", 1_500_000_000), (4096, 4096)])
def test_whole_quantities(text, value):
    assert claims.quantity(text, "memory") == value


@pytest.mark.parametrize("text", ["1.5Gi", "500m", "-1", "4 Gi", "\uff14Gi"])  # the last: a fullwidth digit
def test_other_quantities_are_one_line_errors(text):
    with pytest.raises(claims.ClaimError, match="not a whole quantity"):
        claims.quantity(text, "memory")


def _claim(config: list) -> dict:
    result = {"request": "r", "driver": "gpuslice.io", "pool": "n", "device": "gpu-0",
              "consumedCapacity": {"memory": "1Gi", "cores": "10"}}  # fmt: skip
    return {"metadata": {"uid": "u", "namespace": "ns", "name": "c"},
            "status": {"allocation": {"devices": {"results": [result], "config": config}}}}  # fmt: skip


def _opaque(source: str, **params: str) -> dict:
    return {"source": source, "opaque": {"driver": "gpuslice.io", "parameters": {"apiVersion": "gpuslice.io/v1",
                                                                                 **params}}}  # fmt: skip


def test_the_claims_configuration_wins_over_its_class():
    parsed = claims.parse(_claim([_opaque("FromClaim", computePolicy="hard"),
                                  _opaque("FromClass", computePolicy="elastic", priority="low")]), "n")  # fmt: skip
    assert (parsed.policy, parsed.priority) == ("hard", "low")
    assert parsed.devices[0].memory == 1 << 30 and parsed.devices[0].cores == 10


def test_another_drivers_configuration_is_not_ours():
    other = {"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": {"sharing": "x"}}}
    assert claims.parse(_claim([other]), "n").policy is None


def test_unknown_configuration_is_refused_with_what_is_accepted():
    with pytest.raises(claims.ClaimError, match=re.escape("unknown ['sharing']; accepted: apiVersion gpuslice.io/v1")):
        claims.parse(_claim([_opaque("FromClaim", sharing="timeslice")]), "n")

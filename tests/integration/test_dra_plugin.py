"""The DRA kubelet plugin against the real contracts: a stand-in kubelet over
the kubelet's own protos (registration, then NodePrepareResources and
NodeUnprepareResources in v1 and v1beta1), claims exactly as kube-scheduler
writes them served by a stand-in API server, every object validated against
the Kubernetes 1.37 schemas, and the daemon on the simulator holding the
slices."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid

import pytest
import yaml

from gpuslice import errors
from gpuslice.cdi import spec as cdi_spec
from gpuslice.cli import sim_daemon
from gpuslice.dra.checkpoint import Checkpoint
from gpuslice.dra.plugin import base_spec
from gpuslice.dra.prepare import ClaimRef, Preparer
from tests.harness.dra import NODE, DraNode, allocated
from tests.harness.machine import gpu
from tests.harness.references import schema_validator

GiB = 1 << 30


@pytest.fixture
def node(daemon, tmp_path):
    d = daemon([gpu("16Gi"), gpu("16Gi")], [{"gpus": [0, 1], "pcie": "hostbridge", "nvlinks": 4}])
    spec = tmp_path / "cdi" / "gpuslice.json"
    spec.parent.mkdir()
    r = sim_daemon.cdi_generate(d, spec)
    assert r.returncode == 0, r.stderr
    n = DraNode(d, spec, tmp_path, tmp_path / "run-cdi")
    n.start_plugin()
    yield n
    n.close()


def published(node: DraNode) -> dict:
    deadline = time.monotonic() + 20
    while f"{NODE}-gpuslice.io" not in node.api.slices:
        assert time.monotonic() < deadline, (node.api.invalid, node.log())
        time.sleep(0.05)
    return node.api.slices[f"{NODE}-gpuslice.io"]


def test_the_kubelet_registers_it_and_picks_v1(node):
    got = node.kubelet("register", str(node.registry / "gpuslice.io-reg.sock"))
    assert got["info"] == {"type": "DRAPlugin", "name": "gpuslice.io", "endpoint": str(node.endpoint),
                           "supported_versions": ["v1.DRAPlugin", "v1beta1.DRAPlugin"]}  # fmt: skip
    assert got["chosen"] == "v1.DRAPlugin" and got["error"] == ""
    assert "registered with the kubelet" in node.log()


def test_the_resource_slice_offers_each_gpu_as_shareable_capacity(node):
    obj = published(node)
    assert node.api.invalid == []  # the schema-checked write went through
    spec = obj["spec"]
    assert spec["driver"] == "gpuslice.io" and spec["nodeName"] == NODE and spec["pool"]["name"] == NODE
    inventory = {g.index: g for g in node.d.client().inventory().gpus}
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1"]
    for device in spec["devices"]:
        g = inventory[int(device["name"].split("-")[1])]
        assert device["allowMultipleAllocations"] is True
        assert device["capacity"]["memory"]["value"] == str(16 * GiB)
        assert device["capacity"]["cores"]["value"] == "100"
        assert device["capacity"]["memory"]["requestPolicy"]["validRange"]["step"] == str(256 << 20)
        attrs = device["attributes"]
        assert attrs["uuid"] == {"string": g.uuid} and attrs["index"] == {"int": g.index}
        assert attrs["driverVersion"] == {"version": "580.95.5"}  # 580.95.05 as semantic versioning has it
        assert attrs["cudaComputeCapability"] == {"version": "8.0.0"} and attrs["architecture"] == {"string": "Ampere"}
    # GPUs joined by NVLink under one host bridge share both placement attributes
    a, b = (d["attributes"] for d in spec["devices"])
    assert a["nvlinkDomain"] == b["nvlinkDomain"] and a["pcieRoot"] == b["pcieRoot"]
    assert node.api.writes == [("create", f"{NODE}-gpuslice.io")]  # unchanged GPUs are not written again


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_a_claim_becomes_a_slice_of_exactly_what_was_allocated_and_goes_away(node, version):
    params = {"apiVersion": "gpuslice.io/v1", "kind": "SliceConfig", "computePolicy": "hard", "priority": "high"}
    config = [{"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": "gpuslice.io", "parameters": params}}]
    claim = allocated("train", ("gpu-1", "4Gi", "30"), config=config)
    node.api.put_claim(claim)
    uid = claim["metadata"]["uid"]
    answer = node.prepare(claim, version=version)[uid]
    assert answer.get("error", "") == ""
    (device,) = answer["devices"]
    assert device["request_names"] == ["gpu"] and device["pool_name"] == NODE and device["device_name"] == "gpu-1"
    assert device["cdi_device_ids"] == [f"gpuslice.io/claim={uid}"]
    result = claim["status"]["allocation"]["devices"]["results"][0]
    assert device.get("share_id") == (result["shareID"] if version == "v1" else None)

    s = node.slices()[f"claim-{uid}"]
    uuid1 = node.d.client().inventory().gpus[1].uuid
    assert [(g.uuid, g.memory_limit, g.cores) for g in s.gpus] == [(uuid1, 4 * GiB, 30)]
    assert s.policy == "hard" and s.priority == "high"

    spec_file = node.claim_specs / f"gpuslice.io-claim_{uid}.json"
    data = json.loads(spec_file.read_text())
    schema_validator("cdi", "schema.json").validate(data)
    claim_device = cdi_spec.load(spec_file).device(uid)
    assert f"GPUSLICE_CLAIM={uid}" in claim_device.edits.env
    assert f"GPUSLICE_DEVICE_1={uuid1}" in claim_device.edits.env and not any(
        e.startswith("GPUSLICE_DEVICE_0=") for e in claim_device.edits.env
    )
    assert any(m.container_path.endswith("wrap/libcuda.so.1") for m in claim_device.edits.mounts)

    assert node.prepare(claim, version=version)[uid] == answer  # again: the same answer, one slice
    assert len(node.slices()) == 1

    assert node.unprepare(claim, version=version)[uid] == {"error": ""}
    assert node.slices() == {} and not spec_file.exists()
    assert node.unprepare(claim, version=version)[uid] == {"error": ""}  # idempotent


def test_two_claims_share_a_gpu_and_a_two_gpu_claim_takes_both(node):
    a = allocated("a", ("gpu-0", "6Gi", "40"))
    b = allocated("b", ("gpu-0", "6Gi", "40"))
    both = allocated("pair", ("gpu-0", "2Gi", "20"), ("gpu-1", "2Gi", "20"))
    for c in (a, b, both):
        node.api.put_claim(c)
    answers = node.prepare(a, b, both)
    assert all(answers[c["metadata"]["uid"]].get("error", "") == "" for c in (a, b, both)), answers
    gpus = node.d.client().inventory().gpus
    assert gpus[0].memory_reserved == 14 * GiB and gpus[0].cores_reserved == 100  # all of it, as the scheduler booked
    pair = node.slices()[f"claim-{both['metadata']['uid']}"]
    assert sorted(g.index for g in pair.gpus) == [0, 1] and {g.memory_limit for g in pair.gpus} == {2 * GiB}
    node.unprepare(a, b, both)
    assert node.slices() == {}


def test_a_failing_claim_leaves_nothing_and_the_others_stand(node):
    too_big = allocated("huge", ("gpu-0", "20Gi", None))
    elsewhere = allocated("other-node", ("gpu-0", "1Gi", None))
    elsewhere["status"]["allocation"]["devices"]["results"][0]["pool"] = "node-b"
    params = {"apiVersion": "gpuslice.io/v1", "computePolicy": "strict"}
    bad_config = allocated(
        "typo", ("gpu-0", "1Gi", None), config=[{"source": "FromClass", "opaque": {"driver": "gpuslice.io",
                                                                                   "parameters": params}}]
    )  # fmt: skip
    good = allocated("fine", ("gpu-1", "1Gi", None))
    for c in (too_big, elsewhere, bad_config, good):
        node.api.put_claim(c)
    missing = {"metadata": {"uid": str(uuid.uuid4()), "namespace": "ml", "name": "never-created"}}
    answers = node.prepare(too_big, elsewhere, bad_config, good, missing)
    errors = {c["metadata"]["name"]: answers[c["metadata"]["uid"]].get("error", "")
              for c in (too_big, elsewhere, bad_config, good, missing)}  # fmt: skip
    assert errors["huge"] == "claim ml/huge: request needs 20.0 GiB per GPU, more than any GPU holds", errors
    assert errors["other-node"] == "claim ml/other-node: devices of pool node-b, not of this node (node-a)"
    assert errors["typo"] == "claim ml/typo: computePolicy 'strict': accepted hard, elastic"
    assert "404" in errors["never-created"]
    assert errors["fine"] == ""
    assert all(len(e.splitlines()) <= 1 for e in errors.values())
    assert list(node.slices()) == [f"claim-{good['metadata']['uid']}"]
    assert sorted(p.name for p in node.claim_specs.iterdir()) == [f"gpuslice.io-claim_{good['metadata']['uid']}.json"]


def test_a_restart_between_prepare_and_unprepare_keeps_the_claim(node):
    claim = allocated("long", ("gpu-0", "3Gi", "40"))
    node.api.put_claim(claim)
    uid = claim["metadata"]["uid"]
    first = node.prepare(claim)[uid]
    node.stop_plugin(signal.SIGKILL)
    node.start_plugin()
    assert node.prepare(claim)[uid] == first  # from the checkpoint
    assert len(node.slices()) == 1
    checkpoint = json.loads((node.plugin_dir / "checkpoint.json").read_text())
    assert checkpoint["version"] == 1 and list(checkpoint["claims"]) == [uid]
    assert oct(os.stat(node.plugin_dir / "checkpoint.json").st_mode & 0o777) == "0o600"
    assert node.unprepare(claim)[uid] == {"error": ""}
    assert node.slices() == {} and json.loads((node.plugin_dir / "checkpoint.json").read_text())["claims"] == {}


def test_a_whole_gpu_class_gives_the_claim_the_whole_gpu(node):
    whole = {"apiVersion": "gpuslice.io/v1", "kind": "SliceConfig", "wholeGPU": True}
    config = [{"source": "FromClass", "opaque": {"driver": "gpuslice.io", "parameters": whole}}]
    claim = allocated("legacy", ("gpu-0", None, None), config=config)
    node.api.put_claim(claim)
    uid = claim["metadata"]["uid"]
    assert node.prepare(claim)[uid].get("error", "") == ""
    s = node.slices()[f"claim-{uid}"]
    assert s.whole and [g.memory_limit for g in s.gpus] == [16 * GiB]
    assert node.unprepare(claim)[uid] == {"error": ""}


def gpus_of(obj: dict) -> dict[str, dict]:
    return {d["name"]: d for d in obj["spec"]["devices"]}


def test_a_failing_gpu_is_tainted_and_a_daemon_restart_keeps_the_claims(daemon, tmp_path):
    """GPU 1 with uncorrected ECC errors is published tainted; then the daemon
    restarts on a node whose GPU 0 fails too: the plugin republishes (a new
    pool generation) and the claim prepared before is still there to unprepare."""
    d = daemon([gpu("16Gi"), gpu("16Gi", ecc_uncorrected=3)])
    spec = tmp_path / "gpuslice.json"
    assert sim_daemon.cdi_generate(d, spec).returncode == 0
    node = DraNode(d, spec, tmp_path, tmp_path / "run-cdi")
    node.plugin_args = ["--resync", "0.2"]
    node.start_plugin()
    try:
        first = published(node)
        assert node.api.invalid == []
        devices = gpus_of(first)
        assert "taints" not in devices["gpu-0"]
        assert devices["gpu-1"]["taints"] == [{"key": "gpuslice.io/unhealthy", "effect": "NoSchedule"}]
        assert "GPU 1" in node.log() and "3 uncorrected ECC errors" in node.log()

        claim = allocated("survivor", ("gpu-0", "2Gi", None))
        node.api.put_claim(claim)
        uid = claim["metadata"]["uid"]
        assert node.prepare(claim)[uid].get("error", "") == ""
        d.kill()
        config = d.dir / "sim.yaml"
        machine = yaml.safe_load(config.read_text())
        machine["gpus"][0]["ecc_uncorrected"] = 1
        config.write_text(yaml.safe_dump(machine))
        d = daemon.restart(d)
        deadline = time.monotonic() + 20
        while node.api.slices[f"{NODE}-gpuslice.io"]["spec"]["pool"]["generation"] < 2:
            assert time.monotonic() < deadline, node.log()
            time.sleep(0.1)
        again = gpus_of(node.api.slices[f"{NODE}-gpuslice.io"])
        assert "taints" in again["gpu-0"] and "taints" in again["gpu-1"]
        assert [s.container_id for s in d.client().list()] == [f"claim-{uid}"]  # the daemon's store kept it
        assert node.unprepare(claim)[uid] == {"error": ""}
        assert d.client().list() == []
    finally:
        node.close()


def test_the_daemons_error_kind_reaches_the_plugin_and_nothing_stays(node, tmp_path):
    """A claim the GPU has no room for now: the daemon's RESOURCE_EXHAUSTED is
    the Preparer's ResourceExhausted (not flattened into another kind), named
    for the claim; no spec, no checkpoint entry, no slice."""
    claim = allocated("big", ("gpu-0", "12Gi", None))
    node.d.client().reserve("held", {"gpuslice.io/memory": "8Gi", "gpuslice.io/device": "0"})
    checkpoint = Checkpoint(tmp_path / "checkpoint.json")
    preparer = Preparer(NODE, node.d.client(), lambda namespace, name: claim, base_spec(node.spec),
                        tmp_path / "claim-specs", checkpoint)  # fmt: skip
    with pytest.raises(errors.ResourceExhausted, match=r"^claim ml/big: no room for 12\.0 GiB and 0 cores: GPU 0"):
        preparer.prepare(ClaimRef(claim["metadata"]["uid"], "ml", "big"))
    assert checkpoint.get(claim["metadata"]["uid"]) is None and not (tmp_path / "claim-specs").exists()
    assert list(node.slices()) == ["held"]


def test_a_claim_of_two_sizes_is_prepared_exactly(node):
    """Each allocated share keeps its own size (the plugin refused this
    before the daemon's typed claims: "one size on every GPU")."""
    claim = allocated("sizes", ("gpu-0", "8Gi", "60"), ("gpu-1", "2Gi", "50"))
    node.api.put_claim(claim)
    uid = claim["metadata"]["uid"]
    assert node.prepare(claim)[uid].get("error", "") == ""
    s = node.slices()[f"claim-{uid}"]
    assert s.kind == "claim" and [(g.index, g.memory_limit, g.cores) for g in s.gpus] == [
        (0, 8 * GiB, 60),
        (1, 2 * GiB, 50),
    ]
    assert node.unprepare(claim)[uid].get("error", "") == "" and node.slices() == {}


def test_two_shares_of_one_gpu_in_one_claim_are_prepared_as_allocated(node):
    """kube-scheduler puts two shares of one claim on the same device, each
    with its own shareID and both capacities: each is booked as allocated,
    and the slice's limit on that GPU is their sum."""
    claim = allocated("twice", ("gpu-0", "4Gi", "30"), ("gpu-0", "2Gi", "20"))
    node.api.put_claim(claim)
    uid = claim["metadata"]["uid"]
    answer = node.prepare(claim)[uid]
    assert answer.get("error", "") == "" and len(answer["devices"]) == 2
    s = node.slices()[f"claim-{uid}"]
    shares = {r["shareID"] for r in claim["status"]["allocation"]["devices"]["results"]}
    assert sorted((g.index, g.memory_limit, g.cores) for g in s.gpus) == [(0, 2 * GiB, 20), (0, 4 * GiB, 30)]
    assert {g.share_id for g in s.gpus} == shares
    gpu0 = node.d.client().inventory().gpus[0]
    assert (gpu0.memory_reserved, gpu0.cores_reserved) == (6 * GiB, 50)
    assert node.unprepare(claim)[uid].get("error", "") == "" and node.slices() == {}

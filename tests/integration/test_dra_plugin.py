"""The DRA kubelet plugin against the real contracts: a stand-in kubelet over
the kubelet's own protos (registration, then NodePrepareResources and
NodeUnprepareResources in v1 and v1beta1), claims exactly as kube-scheduler
writes them served by a stand-in API server, every object validated against
the Kubernetes 1.37 schemas, and the daemon on the simulator holding the
slices."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import stat
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpuslice import constants, errors
from gpuslice.allocator.membership import MembershipKey, claim_share
from gpuslice.cdi import spec as cdi_spec
from gpuslice.cli import sim_daemon
from gpuslice.client import AllocatorClient
from gpuslice.dra import claims as claim_model
from gpuslice.dra.checkpoint import Checkpoint
from gpuslice.dra.plugin import base_spec_source
from gpuslice.dra.prepare import ClaimRef, Preparer
from tests.harness.dra import NODE, DraNode, Result, allocated
from tests.harness.machine import gpu, needs_root
from tests.harness.references import schema_validator

GiB = 1 << 30


def share_key(d, uid: str, share: str) -> str:  # type: ignore[no-untyped-def]
    """The membership key the daemon `d` gives a claim's share (its state directory holds the secret)."""
    return MembershipKey.load(d.dir / "state").token(claim_share(uid, share))


@pytest.fixture
def node(daemon, tmp_path):
    d = daemon([gpu("16Gi"), gpu("16Gi")], [{"gpus": [0, 1], "pcie": "hostbridge", "nvlinks": 4}],
               metrics={"port": sim_daemon.free_port()})  # fmt: skip
    with DraNode.serving(d, tmp_path) as n:
        yield n


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


def test_its_sockets_are_for_root_alone_whatever_umask_it_inherits(daemon, tmp_path):
    # whoever reaches the DRA socket can unprepare any claim: at umask 000 the sockets were 0777
    d = daemon([gpu("16Gi")])
    n = DraNode(d, tmp_path / "no-spec-needed.json", tmp_path, tmp_path / "run-cdi")
    n.plugin_dir.mkdir(parents=True, mode=0o777)
    os.chmod(n.plugin_dir, 0o777)  # an earlier install's, too open
    n.umask = 0
    sim_daemon.cdi_generate(d, n.spec)
    n.start_plugin()
    try:
        assert stat.S_IMODE(os.stat(n.endpoint).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(n.registry / "gpuslice.io-reg.sock").st_mode) == 0o600
        assert stat.S_IMODE(os.stat(n.plugin_dir).st_mode) == 0o700
        got = n.kubelet("register", str(n.registry / "gpuslice.io-reg.sock"))  # root still reaches it
        assert got["error"] == ""
    finally:
        n.close()


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
    assert device["cdi_device_ids"] == [f"gpuslice.io/claim={uid}-0"]
    result = claim["status"]["allocation"]["devices"]["results"][0]
    assert device.get("share_id") == (result["shareID"] if version == "v1" else None)

    s = node.slices()[f"claim-{uid}"]
    uuid1 = node.d.client().inventory().gpus[1].uuid
    assert [(g.uuid, g.memory_limit, g.cores, g.share_id) for g in s.gpus] == [(uuid1, 4 * GiB, 30, result["shareID"])]
    assert s.policy == "hard" and s.priority == "high"

    spec_file = node.claim_specs / f"gpuslice.io-claim_{uid}.json"
    data = json.loads(spec_file.read_text())
    schema_validator("cdi", "schema.json").validate(data)
    spec = cdi_spec.load(spec_file)
    claim_device = spec.device(f"{uid}-0")
    assert claim_device.edits.env == (
        f"GPUSLICE_DEVICE_1={uuid1}",
        f"GPUSLICE_SHARE_{uid.replace('-', '')}_0={uid}/{result['shareID']}/"
        + share_key(node.d, uid, result["shareID"]),
    )
    assert any(m.container_path.endswith("wrap/libcuda.so.1") for m in spec.edits.mounts)  # once per container
    assert [h.hook_name for h in spec.edits.hooks].count("createRuntime") == 1

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
    too_big = allocated("lost", ("gpu-7", "2Gi", None))  # a GPU the node had when the scheduler placed it
    elsewhere = allocated("other-node", ("gpu-0", "1Gi", None))
    elsewhere["status"]["allocation"]["devices"]["results"][0]["pool"] = "node-b"
    params = {"apiVersion": "gpuslice.io/v1", "computePolicy": "strict"}
    bad_config = allocated(
        "typo",
        ("gpu-0", "1Gi", None),
        config=[{"source": "FromClass", "opaque": {"driver": "gpuslice.io", "parameters": params}}],
    )
    good = allocated("fine", ("gpu-1", "1Gi", None))
    for c in (too_big, elsewhere, bad_config, good):
        node.api.put_claim(c)
    missing = {"metadata": {"uid": str(uuid.uuid4()), "namespace": "ml", "name": "never-created"}}
    answers = node.prepare(too_big, elsewhere, bad_config, good, missing)
    errors = {
        c["metadata"]["name"]: answers[c["metadata"]["uid"]].get("error", "")
        for c in (too_big, elsewhere, bad_config, good, missing)
    }
    assert errors["lost"] == "claim ml/lost: device gpu-7 is not a GPU of this node (it has gpu-0, gpu-1)"
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
    """The whole.gpuslice.io class (or the gpuslice.io/gpu extended resource)
    names no capacity: the allocator books the requestPolicy defaults, all the
    memory and 0 cores; the daemon books the GPU whole, its cores held (100)
    and the slice exclusive, as status and the metrics show (it showed 0 cores,
    an idle elastic share); wholeGPU with less is refused."""
    whole = {"apiVersion": "gpuslice.io/v1", "kind": "SliceConfig", "wholeGPU": True}
    config = [{"source": "FromClass", "opaque": {"driver": "gpuslice.io", "parameters": whole}}]
    claim = allocated("legacy", ("gpu-0", "16Gi", "0"), config=config)
    part = allocated("part", ("gpu-1", "4Gi", "0"), config=config)
    for c in (claim, part):
        node.api.put_claim(c)
    uid = claim["metadata"]["uid"]
    answers = node.prepare(claim, part)
    assert answers[uid].get("error", "") == ""
    s = node.slices()[f"claim-{uid}"]
    assert s.whole and [(g.memory_limit, g.cores) for g in s.gpus] == [(16 * GiB, 100)]
    gpu0 = node.d.client().inventory().gpus[0]
    assert (gpu0.memory_reserved, gpu0.cores_reserved, gpu0.exclusive) == (16 * GiB, 100, True)
    argv = [sys.executable, "-m", "gpuslice.cli", "status", "--json", "--socket", str(node.d.socket)]
    status = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    (g0,) = [g for g in status["inventory"]["gpus"] if g.get("index", 0) == 0]
    assert g0["cores_reserved"] == 100 and g0["exclusive"] is True
    assert next(x for x in status["slices"] if x["container_id"] == f"claim-{uid}")["whole"] is True
    body = urllib.request.urlopen(f"http://127.0.0.1:{node.d.metrics_port}/metrics", timeout=10).read().decode()
    held = {s.labels["gpu"]: s.value for f in text_string_to_metric_families(body) for s in f.samples
            if s.name == "gpuslice_gpu_cores_reserved"}  # fmt: skip
    assert held["0"] == 100, held
    assert answers[part["metadata"]["uid"]]["error"] == (
        f"claim ml/part: request gpu: wholeGPU: true, but it consumed {4 * GiB} bytes of gpu-1; a whole GPU "
        "consumes all of its memory (leave memory out of the request)"
    )
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


@pytest.mark.parametrize(
    "toleration",
    [None, {"key": "gpuslice.io/unhealthy", "operator": "Exists", "effect": "NoSchedule"}, {"operator": "Exists"}],
)
def test_a_claim_placed_on_an_unwell_gpu_is_refused_unless_it_tolerates_the_taint(daemon, tmp_path, toleration):
    """Kubernetes 1.34/1.35 leave device taints off: their allocator placed a claim on a GPU
    with uncorrected ECC errors, published tainted, and the plugin prepared it. Now the prepare
    refuses it in one line, nothing booked, unless the request tolerates the taint."""
    d = daemon([gpu("16Gi"), gpu("16Gi", ecc_uncorrected=2)])
    spec = tmp_path / "gpuslice.json"
    assert sim_daemon.cdi_generate(d, spec).returncode == 0
    node = DraNode(d, spec, tmp_path, tmp_path / "run-cdi")
    node.start_plugin()
    try:
        claim = allocated("on-unwell", ("gpu-1", "4Gi", "20"))  # as the 1.35 allocator writes it
        if toleration:
            claim["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [toleration]
        node.api.put_claim(claim)
        uid = claim["metadata"]["uid"]
        answer = node.prepare(claim)[uid]
        if toleration:
            assert answer.get("error", "") == "" and list(node.slices()) == [f"claim-{uid}"]
            assert node.unprepare(claim)[uid] == {"error": ""}
        else:
            assert answer["error"] == (
                "claim ml/on-unwell: request gpu: gpu-1 is unwell (2 uncorrected ECC errors) and tainted "
                "gpuslice.io/unhealthy:NoSchedule, which the allocator did not honour (device taints are off before "
                "Kubernetes 1.36); nothing was prepared. A request that tolerates gpuslice.io/unhealthy may use it"
            ), answer
            kept = node.plugin_dir / "checkpoint.json"
            assert node.slices() == {}  # nothing booked
            assert not kept.exists() or json.loads(kept.read_text())["claims"] == {}
        healthy = allocated("on-healthy", ("gpu-0", "4Gi", "20"))
        node.api.put_claim(healthy)
        assert node.prepare(healthy)[healthy["metadata"]["uid"]].get("error", "") == ""
    finally:
        node.close()


def test_memory_only_claims_on_a_shared_gpu_are_said_to_get_best_effort_compute(node):
    """With the default of 0 cores the allocator books no compute for a memory-only claim and
    packs such claims onto one GPU; the plugin says so in its log when one joins other tenants."""
    first, second, share = (allocated("mem-a", ("gpu-0", "2Gi", "0")), allocated("mem-b", ("gpu-0", "2Gi", "0")),
                            allocated("with-cores", ("gpu-1", "2Gi", "30")))  # fmt: skip
    for c in (first, second, share):
        node.api.put_claim(c)
        assert node.prepare(c)[c["metadata"]["uid"]].get("error", "") == ""
    log = node.log()
    assert "claim ml/mem-a books" not in log  # alone on its GPU: nothing to say
    assert (
        "claim ml/mem-b books 2048 MiB of gpu-0 and no cores, beside 1 other slice: its compute is best effort" in log
    ), log[-2000:]
    assert "ml/with-cores books" not in log
    for c in (first, second, share):
        node.unprepare(c)


def test_a_claim_prepared_after_the_node_spec_changed_gets_the_new_spec_without_a_restart(node):
    """The node agent makes the node's spec anew when the driver changes (new library
    files to mount). The plugin read it once at start, so every claim prepared after
    a driver update mounted the old driver's files until the plugin restarted."""
    before = allocated("before", ("gpu-0", "2Gi", "20"))
    after = allocated("after", ("gpu-0", "2Gi", "20"))
    gone = allocated("gone", ("gpu-1", "2Gi", "20"))
    for c in (before, after, gone):
        node.api.put_claim(c)
    assert node.prepare(before)[before["metadata"]["uid"]].get("error", "") == ""

    old = cdi_spec.load(node.spec)
    mark = "GPUSLICE_TEST_DRIVER=updated"
    new_edits = dataclasses.replace(old.edits, env=(*old.edits.env, mark))
    cdi_spec.write(dataclasses.replace(old, edits=new_edits), node.spec)  # as `gpuslice cdi generate` writes it
    assert node.prepare(after)[after["metadata"]["uid"]].get("error", "") == ""

    def common_env(claim: dict) -> tuple[str, ...]:
        return cdi_spec.load(node.claim_specs / f"gpuslice.io-claim_{claim['metadata']['uid']}.json").edits.env

    assert mark in common_env(after) and mark not in common_env(before)

    node.spec.unlink()  # the spec gone (a driver being removed): one line, nothing reserved
    error = node.prepare(gone)[gone["metadata"]["uid"]]["error"]
    assert error.startswith(f"claim ml/gone: {node.spec}: cannot read a CDI spec: "), error
    assert "\n" not in error and f"claim-{gone['metadata']['uid']}" not in node.slices()
    node.unprepare(before, after)


def test_the_daemons_error_kind_reaches_the_plugin_and_nothing_stays(node, tmp_path):
    """A claim the GPU has no room for now: the daemon's RESOURCE_EXHAUSTED is
    the Preparer's ResourceExhausted (not flattened into another kind), named
    for the claim; no spec, no checkpoint entry, no slice."""
    claim = allocated("big", ("gpu-0", "12Gi", None))
    node.d.client().reserve("held", {"gpuslice.io/memory": "8Gi", "gpuslice.io/device": "0"})
    checkpoint = Checkpoint(tmp_path / "checkpoint.json")
    preparer = Preparer(NODE, node.d.client(), lambda namespace, name: claim, base_spec_source(node.spec),
                        tmp_path / "claim-specs", checkpoint)  # fmt: skip
    with pytest.raises(errors.ResourceExhausted, match=r"^claim ml/big: no room for 12\.0 GiB and 0 cores: GPU 0"):
        preparer.prepare(ClaimRef(claim["metadata"]["uid"], "ml", "big"))
    assert checkpoint.get(claim["metadata"]["uid"]) is None and not (tmp_path / "claim-specs").exists()
    assert list(node.slices()) == ["held"]


def test_a_prepare_with_the_daemon_away_is_unavailable_named_for_the_claim(node, tmp_path):
    """The daemon not answering at the first RPC of a prepare: the kubelet's
    retryable Unavailable (the same kind as any later RPC gives), naming the
    claim; nothing written."""
    claim = allocated("away", ("gpu-0", "1Gi", None))
    away = AllocatorClient(tmp_path / "no-daemon.sock", timeout=2)
    checkpoint = Checkpoint(tmp_path / "checkpoint.json")
    preparer = Preparer(
        NODE, away, lambda namespace, name: claim, base_spec_source(node.spec), tmp_path / "claim-specs", checkpoint
    )
    with pytest.raises(errors.Unavailable, match=r"^claim ml/away: ") as said:
        preparer.prepare(ClaimRef(claim["metadata"]["uid"], "ml", "away"))
    assert type(said.value) is errors.Unavailable, type(said.value)
    assert checkpoint.get(claim["metadata"]["uid"]) is None and not (tmp_path / "claim-specs").exists()


@pytest.fixture
def full_fs(tmp_path):  # type: ignore[no-untyped-def]
    """A 64 KiB tmpfs for the checkpoint, and how to fill it and free it again."""
    where = tmp_path / "plugin-fs"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(where)], check=True)
    filler = where / "filler"

    def fill(full: bool) -> None:
        if full:
            with open(filler, "wb") as f, contextlib.suppress(OSError):
                f.write(b"\0" * (1 << 20))  # ENOSPC once the 64 KiB are taken
        else:
            filler.unlink(missing_ok=True)

    yield where, fill
    subprocess.run(["umount", "-l", str(where)], check=False)


@needs_root
def test_a_full_disk_fails_the_prepare_in_words_and_the_retry_prepares_for_real(node, tmp_path, full_fs):
    """The checkpoint kept a claim in memory though its file could not be
    written; the kubelet's retry was then answered with a device and no slice
    and no spec existed. Memory now follows disk."""
    where, fill = full_fs
    claim = allocated("disk", ("gpu-0", "2Gi", "20"))
    uid = claim["metadata"]["uid"]
    checkpoint = Checkpoint(where / "checkpoint.json")
    preparer = Preparer(NODE, node.d.client(), lambda namespace, name: claim, base_spec_source(node.spec),
                        tmp_path / "claim-specs", checkpoint)  # fmt: skip
    fill(True)
    with pytest.raises(errors.Unavailable, match=rf"^checkpoint {where}/checkpoint.json: No space left on device"):
        preparer.prepare(ClaimRef(uid, "ml", "disk"))
    assert checkpoint.get(uid) is None and node.slices() == {}
    assert not preparer.spec_path(uid).exists()
    fill(False)
    (device,) = preparer.prepare(ClaimRef(uid, "ml", "disk"))  # the kubelet's retry
    assert device["cdi_device_ids"] == [f"gpuslice.io/claim={uid}-0"]
    assert list(node.slices()) and preparer.spec_path(uid).is_file()
    assert list(json.loads((where / "checkpoint.json").read_text())["claims"]) == [uid]
    # an unprepare that cannot write keeps the entry in memory and on disk alike; its retry ends it
    fill(True)
    with pytest.raises(errors.Unavailable) as said:
        preparer.unprepare(ClaimRef(uid, "ml", "disk"))
    # what happened, not "nothing was changed": the slice and the spec are gone, the entry stays
    assert str(said.value) == (
        f"claim ml/disk: slice claim-{uid} released and its CDI specs removed; kept: its entry "
        f"in the checkpoint {where}/checkpoint.json (No space left on device), which a retry "
        "removes"
    )
    assert node.slices() == {} and not preparer.spec_path(uid).exists()
    assert checkpoint.get(uid) is not None
    fill(False)
    preparer.unprepare(ClaimRef(uid, "ml", "disk"))
    assert checkpoint.get(uid) is None and node.slices() == {} and Checkpoint(where / "checkpoint.json").claims == {}


@needs_root
def test_a_full_disk_under_the_claim_specs_is_one_line_and_nothing_prepared(node, tmp_path, full_fs):
    """Found by the soak: the claim's spec write on a full disk came out as a
    bare OSError (the kubelet's "internal error")."""
    where, fill = full_fs
    claim = allocated("specs", ("gpu-0", "2Gi", "20"))
    uid = claim["metadata"]["uid"]
    preparer = Preparer(NODE, node.d.client(), lambda namespace, name: claim, base_spec_source(node.spec),
                        where / "cdi", Checkpoint(tmp_path / "checkpoint.json"))  # fmt: skip
    fill(True)
    with pytest.raises(errors.Unavailable, match=r"^claim ml/specs: its CDI spec .*: No space left on device; nothing"):
        preparer.prepare(ClaimRef(uid, "ml", "specs"))
    assert node.slices() == {} and not preparer.spec_path(uid).exists()
    fill(False)
    preparer.prepare(ClaimRef(uid, "ml", "specs"))
    assert list(node.slices()) == [f"claim-{uid}"] and preparer.spec_path(uid).is_file()


@pytest.mark.parametrize("lost", ["slice", "spec"])
def test_a_kept_answer_whose_slice_or_spec_is_gone_is_prepared_again(node, lost):
    claim = allocated("kept", ("gpu-0", "2Gi", "20"))
    node.api.put_claim(claim)
    uid = claim["metadata"]["uid"]
    first = node.prepare(claim)[uid]
    (slice_id,) = node.slices()
    if lost == "slice":
        node.d.client().release(slice_id)  # e.g. a daemon whose store was lost
    else:
        (node.claim_specs / f"gpuslice.io-claim_{uid}.json").unlink()
    again = node.prepare(claim)[uid]
    assert again == first and len(node.slices()) == 1
    assert (node.claim_specs / f"gpuslice.io-claim_{uid}.json").is_file()
    assert "the checkpoint's answer names what is gone" in node.log()


def booked(node: DraNode) -> dict[int, tuple[int, int]]:
    return {g.index: (g.memory_reserved, g.cores_reserved) for g in node.d.client().inventory().gpus}


def scheduler_books(claims: list[dict]) -> dict[int, tuple[int, int]]:
    """What kube-scheduler holds against each GPU: the consumedCapacity of
    every result but admin access (foreachAllocatedDevice leaves those out)."""
    books = {0: (0, 0), 1: (0, 0)}
    for c in claims:
        for r in c["status"]["allocation"]["devices"]["results"]:
            if not r.get("adminAccess"):
                i, (m, k) = int(r["device"].split("-")[1]), books[int(r["device"].split("-")[1])]
                used = r["consumedCapacity"]
                books[i] = (m + claim_model.quantity(used["memory"], "memory"), k + int(used["cores"]))
    return books


def test_one_request_per_size_each_with_its_own_config(node):
    """docs/dra.md's advice: one request per size. The allocator puts 8Gi/60
    and 2Gi/50 on two GPUs; each is its own share with its own entry of the
    claim's config (the plugin refused this before: "different memory or cores")."""
    cfg = [{"source": "FromClaim", "requests": ["big"], "opaque": {"driver": "gpuslice.io", "parameters": {
               "apiVersion": "gpuslice.io/v1", "kind": "SliceConfig", "computePolicy": "hard", "priority": "high"}}},
           {"source": "FromClaim", "requests": ["small"], "opaque": {"driver": "gpuslice.io", "parameters": {
               "apiVersion": "gpuslice.io/v1", "kind": "SliceConfig", "priority": "low"}}}]  # fmt: skip
    claim = allocated("sizes", Result("gpu-0", "8Gi", "60", "big"), Result("gpu-1", "2Gi", "50", "small"), config=cfg)
    node.api.put_claim(claim)
    uid = claim["metadata"]["uid"]
    answer = node.prepare(claim)[uid]
    assert answer.get("error", "") == ""
    assert [(d["request_names"], d["cdi_device_ids"]) for d in answer["devices"]] == [
        (["big"], [f"gpuslice.io/claim={uid}-0"]),
        (["small"], [f"gpuslice.io/claim={uid}-1"]),
    ]
    s = node.slices()[f"claim-{uid}"]
    assert [(g.index, g.memory_limit, g.cores, g.policy, g.priority) for g in s.gpus] == [
        (0, 8 * GiB, 60, "hard", "high"),
        (1, 2 * GiB, 50, "elastic", "low"),
    ]
    assert booked(node) == scheduler_books([claim])
    assert node.unprepare(claim)[uid].get("error", "") == "" and node.slices() == {}


def test_two_requests_of_one_claim_on_one_gpu_are_two_shares_and_two_devices(node):
    """kube-scheduler 1.36 puts two requests of one claim on gpu-0, each with
    its own shareID (each request searches from the first device): two shares
    booked as allocated, one CDI device each, so that a container naming one
    request gets that share's device only (the plugin refused this before:
    "one GPU allocated twice")."""
    claim = allocated("pair", Result("gpu-0", "4Gi", "30", "a"), Result("gpu-0", "2Gi", "20", "b"))
    node.api.put_claim(claim)
    uid = claim["metadata"]["uid"]
    answer = node.prepare(claim)[uid]
    assert answer.get("error", "") == "" and [d["request_names"] for d in answer["devices"]] == [["a"], ["b"]]
    results = claim["status"]["allocation"]["devices"]["results"]
    spec = cdi_spec.load(node.claim_specs / f"gpuslice.io-claim_{uid}.json")
    for n, r in enumerate(results):
        env = spec.device(f"{uid}-{n}").edits.env
        assert [e for e in env if e.startswith("GPUSLICE_SHARE_")] == [
            f"GPUSLICE_SHARE_{uid.replace('-', '')}_{n}={uid}/{r['shareID']}/{share_key(node.d, uid, r['shareID'])}"
        ]
    s = node.slices()[f"claim-{uid}"]
    assert sorted((g.memory_limit, g.cores, g.share_id) for g in s.gpus) == sorted(
        [(4 * GiB, 30, results[0]["shareID"]), (2 * GiB, 20, results[1]["shareID"])]
    )
    assert booked(node)[0] == (6 * GiB, 50)
    assert node.unprepare(claim)[uid].get("error", "") == "" and node.slices() == {}


def test_one_request_given_the_same_gpu_twice_is_refused_naming_the_fix(node):
    """Kubernetes 1.34-1.35 can give a count: 2 request one shared GPU twice."""
    claim = allocated("twice", ("gpu-0", "4Gi", "30"), ("gpu-0", "4Gi", "30"))
    node.api.put_claim(claim)
    error = node.prepare(claim)[claim["metadata"]["uid"]]["error"]
    assert error == (
        "claim ml/twice: request gpu was given GPU gpu-0 twice (a scheduler before Kubernetes 1.36 does this for "
        "count > 1); ask for count: 1 per request, or run Kubernetes 1.36 or later"
    )
    assert node.slices() == {} and not list(node.claim_specs.glob("*.json"))


def test_admin_access_books_nothing_and_gives_the_gpu_for_monitoring(node):
    """An admin-access request gets a share ID and consumedCapacity from the
    allocator, which the scheduler leaves out of its books: so does the
    daemon, and a fourth 4Gi/25 claim the scheduler placed beside it fits."""
    monitor = allocated("monitor", Result("gpu-0", "16Gi", "0", "watch", admin=True))  # the defaults, unbooked
    fours = [allocated(f"four-{i}", ("gpu-0", "4Gi", "25")) for i in range(4)]
    for c in (monitor, *fours):
        node.api.put_claim(c)
    answers = node.prepare(monitor, *fours)
    assert all(a.get("error", "") == "" for a in answers.values()), answers
    uid = monitor["metadata"]["uid"]
    assert f"claim-{uid}" not in node.slices()  # nothing reserved
    assert booked(node) == scheduler_books([monitor, *fours]) == {0: (16 * GiB, 100), 1: (0, 0)}
    assert not (node.claim_specs / f"gpuslice.io-claim_{uid}.json").exists()
    admin = cdi_spec.load(node.claim_specs / f"gpuslice.io-claim_{uid}_admin.json")
    assert [d.name for d in admin.devices] == [f"{uid}-0"]
    # the driver found through the loader cache, as in a slice's container; no slice's hooks, no library path
    assert [h.args for h in admin.edits.hooks] == [("gpuslice-hook", "update-ldcache")]
    assert not any(e.startswith(("LD_LIBRARY_PATH=", constants.ENV_REAL_LIBCUDA)) for e in admin.edits.env)
    assert not any(
        "/wrap/" in m.container_path or m.container_path == constants.SLICE_SOCKET_DIR for m in admin.edits.mounts
    )
    assert any(m.container_path.endswith("driver/libnvidia-ml.so.1") for m in admin.edits.mounts)
    assert "monitoring, nothing reserved" in node.log()
    assert node.unprepare(monitor, *fours) == {c["metadata"]["uid"]: {"error": ""} for c in (monitor, *fours)}
    assert not list(node.claim_specs.glob("*.json")) and node.slices() == {}


def test_a_subrequest_is_answered_under_its_parent_request(node):
    """firstAvailable: the result names "gpu/small"; a container names "gpu"
    (the kubelet matches its request against request_names)."""
    claim = allocated("either", Result("gpu-1", "2Gi", "10", "gpu/small"))
    node.api.put_claim(claim)
    uid = claim["metadata"]["uid"]
    answer = node.prepare(claim)[uid]
    assert answer.get("error", "") == "" and answer["devices"][0]["request_names"] == ["gpu"]
    assert node.unprepare(claim)[uid] == {"error": ""}


def test_the_books_equal_the_schedulers_after_every_step(node):
    """After each prepare and unprepare of claims of every shape the
    allocator writes (shares of both sizes, two requests on one GPU, a
    memory-only claim at the default 0 cores, admin access, a whole GPU),
    the daemon's reserved memory and cores per GPU equal the sum of the
    non-admin consumedCapacity of the claims prepared."""
    whole = [{"source": "FromClass", "opaque": {"driver": "gpuslice.io", "parameters": {
        "apiVersion": "gpuslice.io/v1", "kind": "SliceConfig", "wholeGPU": True}}}]  # fmt: skip
    shapes = [
        allocated("memory-only-a", ("gpu-0", "3Gi", "0")),
        allocated("memory-only-b", ("gpu-0", "3Gi", "0")),  # shares the GPU: 0 cores each
        allocated("two-requests", Result("gpu-0", "2Gi", "30", "a"), Result("gpu-0", "1Gi", "20", "b")),
        allocated("full-compute", ("gpu-1", "4Gi", "100")),
        allocated("watch", Result("gpu-1", "16Gi", "0", "m", admin=True)),
        allocated("sizes", Result("gpu-0", "256Mi", "10", "x"), Result("gpu-1", "8Gi", "0", "y")),
    ]
    whole_gpu = allocated("whole", ("gpu-1", "16Gi", "0"), config=whole)
    for c in (*shapes, whole_gpu):
        node.api.put_claim(c)
    prepared: list[dict] = []
    for c in shapes:
        assert node.prepare(c)[c["metadata"]["uid"]].get("error", "") == "", c["metadata"]["name"]
        prepared.append(c)
        assert booked(node) == scheduler_books(prepared), c["metadata"]["name"]
    for c in shapes[::2]:
        assert node.unprepare(c)[c["metadata"]["uid"]] == {"error": ""}
        prepared.remove(c)
        assert booked(node) == scheduler_books(prepared), c["metadata"]["name"]
    for c in list(prepared):
        node.unprepare(c)
        prepared.remove(c)
        assert booked(node) == scheduler_books(prepared)
    assert node.prepare(whole_gpu)[whole_gpu["metadata"]["uid"]].get("error", "") == ""
    # the scheduler's books: all the memory, 0 cores; the daemon's: the GPU whole, its cores too
    assert scheduler_books([whole_gpu]) == {0: (0, 0), 1: (16 * GiB, 0)}
    assert booked(node) == {0: (0, 0), 1: (16 * GiB, 100)}
    node.unprepare(whole_gpu)
    assert booked(node) == {0: (0, 0), 1: (0, 0)}

"""The OCI hook (hook/gpuslice_hook.c) on its own: each stage against a test
daemon, with an OCI state on stdin and a bundle on disk, as a runtime runs it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from gpuslice.allocator.membership import MembershipKey, claim_share
from gpuslice.paths import built_executable
from gpuslice.proto import gpuslice_pb2 as pb
from tests.harness.machine import gpu, needs_root, oci_bundle
from tests.harness.shim import run_shim as shim
from tests.harness.slice_socket import run_client

HOOK = built_executable("gpuslice-hook")
LIB_DIRS = ["/usr/lib/gpuslice/wrap", "/usr/lib/gpuslice/driver"]


def hook(stage: str, state: dict | str, socket: Path) -> subprocess.CompletedProcess:
    text = state if isinstance(state, str) else json.dumps(state)
    env = {**os.environ, "GPUSLICE_SOCKET": str(socket)}
    return subprocess.run([str(HOOK), stage], input=text, capture_output=True, text=True, env=env, timeout=60)


def bundle(tmp: Path, annotations: dict[str, str], env: list[str] | None = None) -> Path:
    return oci_bundle(tmp / "bundle", annotations, env)


@needs_root
def test_create_runtime_reserves_and_binds_and_poststop_releases(tmp_path, daemon, containers):
    d, box = daemon(), containers()
    state = {"ociVersion": "1.0.2", "id": "web", "status": "created", "pid": box.init_pid,
             "bundle": str(bundle(tmp_path, {"gpuslice.io/memory": "2Gi", "gpuslice.io/cores": "25"}))}  # fmt: skip
    r = hook("createRuntime", state, d.socket)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    s = d.client().get("web")
    assert s.state == "bound" and s.pid == box.init_pid and s.gpus[0].memory_limit == 2 << 30
    r = hook("poststop", state, d.socket)
    assert r.returncode == 0 and d.client().list() == []


@needs_root
def test_create_runtime_pins_the_slice_to_the_gpus_cdi_injected(tmp_path, daemon, containers):
    d, box = daemon(), containers()
    second = d.client().inventory().gpus[1].uuid
    b = bundle(tmp_path, {"gpuslice.io/memory": "1Gi"}, env=[f"GPUSLICE_DEVICE_1={second}"])
    r = hook("createRuntime", {"id": "pinned", "pid": box.init_pid, "bundle": str(b)}, d.socket)
    assert r.returncode == 0, r.stderr
    assert [g.uuid for g in d.client().get("pinned").gpus] == [second]


def test_bad_annotations_fail_with_the_parsers_line_and_reserve_nothing(tmp_path, daemon):
    d = daemon()
    b = bundle(tmp_path, {"gpuslice.io/memory": "lots"})
    r = hook("createRuntime", {"id": "bad", "pid": os.getpid(), "bundle": str(b)}, d.socket)
    assert r.returncode == 1
    [line] = r.stderr.strip().splitlines()
    assert line.startswith('gpuslice-hook: annotation gpuslice.io/memory: "lots" is not valid; accepted:')
    assert d.client().list() == []


def test_a_state_that_is_not_json_is_one_line(tmp_path, daemon):
    r = hook("createRuntime", "{not json", daemon().socket)
    assert r.returncode == 1
    assert r.stderr.startswith("gpuslice-hook: the OCI state on stdin is not JSON:") and r.stderr.count("\n") == 1


def test_without_the_daemon_create_fails_and_poststop_only_warns(tmp_path):
    state = {"id": "x", "pid": os.getpid(), "bundle": str(bundle(tmp_path, {"gpuslice.io/memory": "1Gi"}))}
    for stage, code in (("createRuntime", 1), ("poststop", 0)):
        r = hook(stage, state, tmp_path / "gpuslice.sock")
        assert r.returncode == code
        [line] = r.stderr.strip().splitlines()
        assert line.startswith(f"gpuslice-hook: no answer from the gpuslice daemon at {tmp_path}/runtime.sock")


def test_usage_is_one_line_and_exit_2(tmp_path):
    r = subprocess.run([str(HOOK), "prestart"], input="{}", capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "gpuslice-hook: usage: gpuslice-hook createRuntime|poststop|update-ldcache (OCI state on stdin)"
    ]


def test_update_ldcache_writes_the_loader_config_and_cache(tmp_path, daemon):
    d = daemon()
    b = bundle(tmp_path, {"gpuslice.io/memory": "1Gi"})
    r = hook("update-ldcache", {"id": "c", "bundle": str(b)}, d.socket)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    conf = b / "rootfs/etc/ld.so.conf.d/00-gpuslice.conf"
    assert conf.read_text().splitlines() == LIB_DIRS
    assert (b / "rootfs/etc/ld.so.cache").exists()


def test_update_ldcache_never_follows_an_images_symlink_out_of_its_root(tmp_path, daemon):
    d = daemon()
    b = bundle(tmp_path, {"gpuslice.io/memory": "1Gi"})
    outside = tmp_path / "host-etc"
    outside.mkdir()
    (b / "rootfs/etc").symlink_to(outside)  # as if the image held /etc -> a host path
    r = hook("update-ldcache", {"id": "c", "bundle": str(b)}, d.socket)
    # the loader cache is how the container finds the interposer: without it the container does not start
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    assert r.stderr.startswith(f"gpuslice-hook: update-ldcache: cannot write {b / 'rootfs'}/etc/ld.so.conf.d/")
    assert list(outside.iterdir()) == []


def test_containers_that_share_a_root_start_together(tmp_path, daemon):
    """Podman's --rootfs gives containers one root: their hooks' ldconfig runs on it at once
    failed renaming the cache's temporary file (the demo's three containers, on a fresh
    clone's CI). The hooks take turns."""
    d = daemon()
    b = bundle(tmp_path, {"gpuslice.io/memory": "1Gi"})
    state = json.dumps({"id": "c", "bundle": str(b)})
    env = {**os.environ, "GPUSLICE_SOCKET": str(d.socket)}
    for _ in range(4):
        runs = [subprocess.Popen([str(HOOK), "update-ldcache"], stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=env) for _ in range(16)]  # fmt: skip
        for r in runs:  # all of them waiting for their state, then all at once
            assert r.stdin
            r.stdin.write(state)
        for r in runs:
            assert r.stdin
            r.stdin.close()
        said = [(r.wait(timeout=60), r.stderr.read() if r.stderr else "")[1] for r in runs]
        assert [r.returncode for r in runs] == [0] * 16, said
    assert not (b / "rootfs/etc/ld.so.cache~").exists()


def test_an_ldconfig_that_fails_aborts_the_container_with_its_reason(tmp_path, daemon):
    d = daemon()
    b = bundle(tmp_path, {"gpuslice.io/memory": "1Gi"})
    (b / "rootfs/etc/ld.so.cache/x").mkdir(parents=True)  # the cache cannot be renamed into place
    r = hook("update-ldcache", {"id": "c", "bundle": str(b)}, d.socket)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"gpuslice-hook: update-ldcache: /sbin/ldconfig -r {b / 'rootfs'} failed (status 1): ")
    assert "ld.so.cache" in r.stderr and r.stderr.rstrip().endswith("cannot find the libcuda.so.1 its CDI spec mounts")


def test_an_image_with_something_else_by_the_conf_files_name_aborts_the_container(tmp_path, daemon):
    """A FIFO where the hook writes its loader configuration held the hook's open for good (no
    reader ever comes); a device node's open would be the device's. Neither is opened."""
    d = daemon()
    b = bundle(tmp_path, {"gpuslice.io/memory": "1Gi"})
    conf = b / "rootfs/etc/ld.so.conf.d/00-gpuslice.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(conf)
    r = hook("update-ldcache", {"id": "c", "bundle": str(b)}, d.socket)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"gpuslice-hook: update-ldcache: {conf} is not a regular file; "), r.stderr


def _running_with(arg: str) -> list[int]:
    """The processes with `arg` among their arguments."""
    found = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and arg in (p / "cmdline").read_bytes().decode(errors="replace").split("\0"):
                found.append(int(p.name))
        except OSError:  # gone meanwhile
            pass
    return found


def test_an_ldconfig_that_never_ends_is_stopped_and_aborts_the_container(tmp_path, daemon):
    """An image's /etc/ld.so.conf that is a FIFO holds ldconfig in its open for good, as a root
    on a stalled filesystem would: the hook stops it at its bound and says so in one line, and
    the root's lock goes with it."""
    d = daemon()
    b = bundle(tmp_path, {"gpuslice.io/memory": "1Gi"})
    conf = b / "rootfs/etc/ld.so.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(conf)
    r = hook("update-ldcache", {"id": "c", "bundle": str(b)}, d.socket)  # today's bound is 20 s; the helper's 60
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"gpuslice-hook: update-ldcache: /sbin/ldconfig -r {b / 'rootfs'} did not finish within")
    assert not _running_with(str(b / "rootfs")), "ldconfig left running"
    conf.unlink()
    assert hook("update-ldcache", {"id": "c", "bundle": str(b)}, d.socket).returncode == 0  # nothing left locked


@pytest.mark.parametrize("stage", ["createRuntime", "poststop"])
def test_a_container_that_asks_for_nothing_is_left_alone(tmp_path, daemon, stage):
    d = daemon()
    r = hook(stage, {"id": "plain", "pid": os.getpid(), "bundle": str(bundle(tmp_path, {}))}, d.socket)
    assert r.returncode == 0 and r.stderr == "" and d.client().list() == []


def test_the_runtime_socket_is_root_only_and_answers_one_line(daemon):
    import socket

    d = daemon()
    path = d.socket.parent / "runtime.sock"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(path))
        s.sendall(b"prestart\n\n{}")
        s.shutdown(socket.SHUT_WR)
        reply = s.makefile().read()
    assert (
        reply
        == "error runtime socket: unknown verb 'prestart'; accepted: createRuntime, poststop, ldcache-root, create\n"
    )


@needs_root
def test_hook_shim_and_cdi_errors_reach_the_metrics_under_their_own_codes(tmp_path, daemon, containers):
    import urllib.request

    from gpuslice.cli.sim_daemon import free_port

    port = free_port()
    d = daemon(gpus=[{"memory": "16Gi"}], metrics={"port": port})
    pid = containers().init_pid  # a process with its own mount namespace, as a container's
    bad = bundle(tmp_path / "bad", {"gpuslice.io/memory": "lots"})
    assert hook("createRuntime", {"id": "bad", "pid": pid, "bundle": str(bad)}, d.socket).returncode == 1
    nothing = tmp_path / "no-bundle"
    assert hook("createRuntime", {"id": "gone", "pid": pid, "bundle": str(nothing)}, d.socket).returncode == 1
    d.client().reserve("big", {"gpuslice.io/memory": "12Gi"})
    full = bundle(tmp_path / "full", {"gpuslice.io/memory": "8Gi"})
    assert hook("createRuntime", {"id": "full", "pid": pid, "bundle": str(full)}, d.socket).returncode == 1
    asks = bundle(tmp_path / "shim", {"gpuslice.io/memory": "1Gi"})
    missing_spec = tmp_path / "missing-spec.json"  # the shim's CDI spec is not there
    r = shim(tmp_path, "create", "--bundle", str(asks), "shimmed", socket=d.socket, spec=missing_spec)
    assert r.returncode == 1 and "cannot read a CDI spec" in r.stderr, r.stderr
    assert [s.container_id for s in d.client().list()] == ["big"]  # nothing half-reserved
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    counted = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in body.splitlines()
        if line.startswith("gpuslice_rpc_total{")
    }
    create_runtime = 'method="runtime.createRuntime"'
    assert counted[f'gpuslice_rpc_total{{code="INVALID_ARGUMENT",{create_runtime}}}'] == 2  # bad value, no bundle
    assert counted[f'gpuslice_rpc_total{{code="RESOURCE_EXHAUSTED",{create_runtime}}}'] == 1
    assert counted['gpuslice_rpc_total{code="FAILED_PRECONDITION",method="runtime.create"}'] == 1  # the CDI spec
    assert not [k for k in counted if 'code="INTERNAL"' in k]


@pytest.mark.parametrize(
    "mark", [("io.kubernetes.cri.container-type", "sandbox"), ("io.kubernetes.cri-o.ContainerType", "sandbox")]
)
def test_a_pods_sandbox_gets_no_slice_from_the_hook_or_the_shim(tmp_path, daemon, mark):

    d = daemon()
    notes = {"gpuslice.io/memory": "2Gi", "gpuslice.io/cores": "30", mark[0]: mark[1]}  # pod annotations copied in
    b = bundle(tmp_path / "hook", notes)
    r = hook("createRuntime", {"id": "pause", "pid": os.getpid(), "bundle": str(b)}, d.socket)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    s = bundle(tmp_path / "shim", notes)
    before = (s / "config.json").read_bytes()
    r = shim(tmp_path, "create", "--bundle", str(s), "pause-shim", socket=d.socket)
    assert r.returncode == 7, r.stderr  # the stand-in runtime ran: nothing refused
    assert (s / "config.json").read_bytes() == before  # untouched
    assert d.client().list() == []


@needs_root
def test_the_hook_follows_the_pods_container_list_and_reads_request_variables(tmp_path, daemon, containers):
    """The CDI + hooks.d path keeps the shim's rules: gpuslice.io/containers
    names the pod's containers that get a slice; GPUSLICE_* variables ask too."""
    d, box = daemon(), containers()
    pod = {"gpuslice.io/memory": "2Gi", "gpuslice.io/containers": "train"}
    sidecar = bundle(tmp_path / "sidecar", {**pod, "io.kubernetes.cri.container-name": "log-shipper"})
    r = hook("createRuntime", {"id": "sidecar", "pid": box.init_pid, "bundle": str(sidecar)}, d.socket)
    assert r.returncode == 0 and r.stderr == "" and d.client().list() == [], r.stderr
    train = bundle(tmp_path / "train", {**pod, "io.kubernetes.container.name": "train"}, env=["GPUSLICE_CORES=40"])
    r = hook("createRuntime", {"id": "train", "pid": box.init_pid, "bundle": str(train)}, d.socket)
    assert r.returncode == 0, r.stderr
    [s] = d.client().list()
    assert s.container_id == "train" and (s.gpus[0].memory_limit, s.gpus[0].cores) == (2 << 30, 40)


def test_a_containers_gpu_policy_in_its_environment_places_its_slice(tmp_path, daemon, containers):
    """What the webhook writes for HAMi's gpu-scheduler-policy in runtimeClass mode, as the hook hands
    it over: GPUSLICE_GPU_POLICY=spread puts the slice on the emptier GPU, which best fit would not."""
    d, box = daemon([gpu("16Gi"), gpu("16Gi")]), containers()
    first = d.client().reserve("first", {"gpuslice.io/memory": "4Gi"}).gpus[0].index
    spread = bundle(tmp_path / "spread", {}, env=["GPUSLICE_MEMORY=2Gi", "GPUSLICE_GPU_POLICY=spread"])
    r = hook("createRuntime", {"id": "spread", "pid": box.init_pid, "bundle": str(spread)}, d.socket)
    assert r.returncode == 0, r.stderr
    assert d.client().get("spread").gpus[0].index != first


def test_a_containers_numa_bind_in_its_environment_takes_its_gpus_from_one_numa_node(tmp_path, daemon, containers):
    """What the webhook writes for HAMi's numa-bind in runtimeClass mode, as the hook hands it over:
    GPUSLICE_NUMA_BIND=true takes a two-GPU slice from one NUMA node, not the NVLinked pair across
    the sockets that the closest set would be."""
    topo = [{"gpus": [0, 1], "pcie": "node", "nvlinks": 0}, {"gpus": [2, 3], "pcie": "node", "nvlinks": 0},
            {"gpus": [1, 2], "pcie": "system", "nvlinks": 4}]  # fmt: skip
    d, box = daemon([gpu("16Gi")] * 4, topology=topo), containers()
    for name, env in (("near", []), ("bound", ["GPUSLICE_NUMA_BIND=true"])):
        b = bundle(tmp_path / name, {}, env=["GPUSLICE_GPUS=2", "GPUSLICE_MEMORY=1Gi", *env])
        r = hook("createRuntime", {"id": name, "pid": box.init_pid, "bundle": str(b)}, d.socket)
        assert r.returncode == 0, r.stderr
    assert sorted(g.index for g in d.client().get("near").gpus) == [1, 2]
    assert sorted(g.index for g in d.client().get("bound").gpus) in ([0, 1], [2, 3])


@needs_root
def test_containers_of_a_claim_share_its_slice_and_leave_it_as_they_stop(tmp_path, daemon, containers):
    """A DRA claim's share (reserved by the kubelet plugin) and two containers
    given its CDI device: both join its group, their processes charge it
    together, and the claim outlives them until it is unprepared."""

    d = daemon(reservation_timeout=0.5)
    client = d.client()
    keys = client.reserve_claim(
        "0f0e", [pb.Share(gpu_index=0, memory=2 << 30, share_id="s1")], owner="dra ml/train"
    ).share_keys
    boxes = {name: containers() for name in ("c1", "c2")}
    b = bundle(tmp_path, {}, env=[f"GPUSLICE_SHARE_0f0e_0=0f0e/s1/{keys['s1']}"])
    for name, box in boxes.items():
        r = hook("createRuntime", {"id": name, "pid": box.init_pid, "bundle": str(b)}, d.socket)
        assert r.returncode == 0, r.stderr
    members = {s.container_id: s for s in client.list()}
    group = next(k for k, s in members.items() if s.owner_kind == pb.SHARE_GROUP)
    assert set(members) == {"claim-0f0e", group, "c1", "c2"} and members["c1"].state == "bound"
    assert members["c1"].member_of == members["c2"].member_of == group
    first = run_client(boxes["c1"], d.slice_socket, 1536 << 20, linger=10)
    assert json.loads(first.stdout.readline())["charged"] is True
    second = run_client(boxes["c2"], d.slice_socket, 1 << 30)
    out = json.loads(second.stdout.readline())
    second.wait(10)
    assert out["limit"] == 2 << 30 and out["charged"] is False  # 1.5 GiB of the claim's 2 are the other's
    first.kill()
    first.wait(10)

    time.sleep(1.5)  # three sweeps past the reservation timeout: neither the claim nor its group is stale
    assert client.get("claim-0f0e").state == "reserved" and client.get(group).owner_kind == pb.SHARE_GROUP
    assert hook("poststop", {"id": "c1", "pid": boxes["c1"].init_pid, "bundle": str(b)}, d.socket).returncode == 0
    assert {s.container_id for s in client.list()} == {"claim-0f0e", group, "c2"}
    assert client.release("claim-0f0e")  # unprepared: its group and its containers' records go with it
    assert client.list() == []


@needs_root
def test_each_container_gets_the_shares_it_was_given_and_no_other(tmp_path, daemon, containers):
    """One claim, two requests on one GPU (kube-scheduler 1.36 puts both on
    gpu-0, each with its share ID): a container given request a sees and
    charges a's 1 GiB only, one given b b's 2 GiB only; their share groups are
    separate, the books hold 3 GiB. A container given both while they are in
    use apart is refused in one line (a share is charged through one group),
    and takes both once they are free."""
    d = daemon()
    client = d.client()
    keys = client.reserve_claim(
        "ab",
        [
            pb.Share(gpu_index=0, memory=1 << 30, cores=20, share_id="a"),
            pb.Share(gpu_index=0, memory=2 << 30, cores=30, share_id="b"),
        ],
    ).share_keys
    a, b = f"GPUSLICE_SHARE_ab_0=ab/a/{keys['a']}", f"GPUSLICE_SHARE_ab_1=ab/b/{keys['b']}"
    gets = {"ca": [a], "cb": [b], "both": [a, b]}
    boxes = {name: containers() for name in gets}
    bundles = {name: bundle(tmp_path / name, {}, env=env) for name, env in gets.items()}
    for name in ("ca", "cb"):
        r = hook("createRuntime", {"id": name, "pid": boxes[name].init_pid, "bundle": str(bundles[name])}, d.socket)
        assert r.returncode == 0, r.stderr
    seen = {}
    for name, size in (("ca", 1 << 30), ("cb", 2 << 30)):
        over = run_client(boxes[name], d.slice_socket, size + (1 << 20))  # one MiB past its share
        seen[name] = json.loads(over.stdout.readline())
        over.wait(10)
    assert (seen["ca"]["limit"], seen["ca"]["charged"]) == (1 << 30, False)
    assert (seen["cb"]["limit"], seen["cb"]["charged"]) == (2 << 30, False)
    gpu0 = client.inventory().gpus[0]
    assert (gpu0.memory_reserved, gpu0.cores_reserved) == (3 << 30, 50)  # the claim's books; share groups book nothing

    r = hook("createRuntime", {"id": "both", "pid": boxes["both"].init_pid, "bundle": str(bundles["both"])}, d.socket)
    [line] = r.stderr.strip().splitlines()
    assert r.returncode == 1 and re.search(
        r"claim share ab/(a is in use by container\(s\) ca|b is in use by "
        r"container\(s\) cb) with other shares of the claim",
        line,
    ), line
    for name in ("ca", "cb"):
        assert hook("poststop", {"id": name, "pid": 1, "bundle": str(bundles[name])}, d.socket).returncode == 0
    assert {s.container_id for s in client.list()} == {"claim-ab"}  # the last member took each group along
    r = hook("createRuntime", {"id": "both", "pid": boxes["both"].init_pid, "bundle": str(bundles["both"])}, d.socket)
    assert r.returncode == 0, r.stderr
    both = run_client(boxes["both"], d.slice_socket, 3 << 30)
    out = json.loads(both.stdout.readline())
    both.wait(10)
    assert out["limit"] == 3 << 30 and out["charged"] is True  # both shares, on the one GPU
    assert client.release("claim-ab") and client.list() == []


@needs_root
def test_a_claim_that_is_not_prepared_fails_the_container_in_one_line(tmp_path, daemon, containers):
    d, box = daemon(), containers()
    key = MembershipKey.load(d.dir / "state").token(claim_share("absent", "s"))  # as a stale device would carry
    b = bundle(tmp_path, {}, env=[f"GPUSLICE_SHARE_absent_0=absent/s/{key}"])
    r = hook("createRuntime", {"id": "orphan", "pid": box.init_pid, "bundle": str(b)}, d.socket)
    assert r.returncode == 1
    [line] = r.stderr.strip().splitlines()
    assert line == (
        "gpuslice-hook: createRuntime for container orphan: the slice of claim absent is not on this node "
        "(the DRA plugin prepares it before the pod's containers start)"
    )
    assert d.client().list() == []


@needs_root
@pytest.mark.parametrize(
    "entry", ["GPUSLICE_CLAIM={uid}", "GPUSLICE_SHARE_x_0={uid}/s1", "GPUSLICE_SHARE_x_0={uid}/s1/{wrong}"]
)
def test_a_container_cannot_join_a_claim_by_naming_it_in_its_env(tmp_path, daemon, containers, entry):
    """A container with a GPU through the hook-only path set GPUSLICE_CLAIM to
    another pod's claim UID and joined that claim's slice: saw its 4 GiB, took
    3 of them, and the claim's own pod was refused its next 2.  The UID (and
    the share ID) are public; only the claim's device carries the share's key."""
    d, box = daemon(), containers()
    client = d.client()
    uid = "7a7a"
    keys = client.reserve_claim(uid, [pb.Share(gpu_index=0, memory=4 << 30, share_id="s1")]).share_keys
    wrong = "0" * len(keys["s1"])
    b = bundle(tmp_path, {}, env=[entry.format(uid=uid, wrong=wrong)])
    r = hook("createRuntime", {"id": "intruder", "pid": box.init_pid, "bundle": str(b)}, d.socket)
    assert r.returncode == 1
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("gpuslice-hook: ") and uid in line, line
    assert "GPUSLICE_SHARE_" in line or "was not given its device" in line, line
    assert {s.container_id for s in client.list()} == {f"claim-{uid}"}  # nobody joined it


@needs_root
def test_a_device_plugin_containers_slice_is_what_it_was_given_on_one_gpu(tmp_path, daemon, containers):
    """Allocations as the device plugin books them (ReserveDevices), joined
    by the env entries of its Allocate answers: memory and cores on one GPU
    make one slice with the container's own compute policy; a forged key, a
    split across GPUs, cores without memory, a size asked again by
    annotation and a GPU its own choice rules out (where the plugin could
    not tell which container it allocated for) are each refused in one
    line, joining nothing."""
    d = daemon([gpu("16Gi"), gpu("16Gi")])
    client = d.client()
    uuids = [g.uuid for g in client.inventory().gpus]
    key = {name: f"dp-{i:024x}" for i, name in enumerate(("mem0", "cores0", "cores1"))}
    tokens = {
        "mem0": client.reserve_devices(key["mem0"], "memory", uuids[0], memory=3 << 30).share_keys["memory"],
        "cores0": client.reserve_devices(key["cores0"], "cores", uuids[0], cores=40).share_keys["cores"],
        "cores1": client.reserve_devices(key["cores1"], "cores", uuids[1], cores=20).share_keys["cores"],
    }

    def entry(name: str, token: str | None = None) -> str:
        share = "memory" if name.startswith("mem") else "cores"
        return f"GPUSLICE_SHARE_{key[name].replace('-', '')}={key[name]}/{share}/{token or tokens[name]}"

    cases = {
        "forged": ([entry("mem0", "0" * 32)], {}, "was not given its device"),
        "split": ([entry("mem0"), entry("cores1")], {}, f"lie on GPUs {', '.join(sorted(uuids))}; a slice lies"),
        "cores-only": ([entry("cores0")], {}, "gpuslice.io/cores without gpuslice.io/memory"),
        "sized-twice": ([entry("mem0")], {"gpuslice.io/memory": "8Gi"}, "sized by its gpuslice.io/* resource limits"),
        "not-there": (
            [entry("mem0"), "GPUSLICE_AVOID_DEVICE=0"],
            {},
            f"the device plugin gave it GPU 0 ({uuids[0]}), one of gpuslice.io/avoid-device 0; it runs only",
        ),
        "not-its-type": ([entry("mem0"), "GPUSLICE_DEVICE_TYPE=H200"], {}, "not of gpuslice.io/device-type H200"),
    }
    for name, (env, notes, said) in cases.items():
        box = containers()
        b = bundle(tmp_path / name, notes, env=env)
        r = hook("createRuntime", {"id": name, "pid": box.init_pid, "bundle": str(b)}, d.socket)
        [line] = r.stderr.strip().splitlines()
        assert r.returncode == 1 and said in line, (name, line)
    assert {s.owner_kind for s in client.list()} == {pb.DEVICES}  # nobody joined anything

    box = containers()
    b = bundle(
        tmp_path / "ok",
        {},
        env=[
            entry("mem0"),
            entry("cores0"),
            "GPUSLICE_COMPUTE_POLICY=hard",
            f"GPUSLICE_DEVICE={uuids[0]}",
            "GPUSLICE_AVOID_DEVICE=1",
        ],
    )
    r = hook("createRuntime", {"id": "ok", "pid": box.init_pid, "bundle": str(b)}, d.socket)
    assert r.returncode == 0, r.stderr
    group = next(s for s in client.list() if s.owner_kind == pb.SHARE_GROUP)
    per = {g.share_id: g for g in group.gpus}
    assert {(g.uuid, g.owner_kind, g.owner_uid) for g in group.gpus} == {
        (uuids[0], pb.DEVICES, key["mem0"]),
        (uuids[0], pb.DEVICES, key["cores0"]),
    }
    assert (per["memory"].memory_limit, per["cores"].cores, per["cores"].policy) == (3 << 30, 40, "hard")
    out = run_client(box, d.slice_socket, 3 << 30)
    seen = json.loads(out.stdout.readline())
    out.wait(10)
    assert seen["limit"] == 3 << 30


@needs_root
@pytest.mark.parametrize(("field", "value", "said"), [("bundle", ["/b"], "bundle is a list; it must be a path"),
                                                      ("pid", "12", "pid is a string; it must be an integer"),
                                                      ("annotations", ["x"], "annotations is a list"),
                                                      ("pid", True, "pid is a boolean")])  # fmt: skip
def test_a_state_field_of_the_wrong_type_is_one_line_naming_it(tmp_path, daemon, field, value, said):
    """A bundle given as a JSON list answered "internal error: expected str..." from the runtime socket."""
    state = {"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": os.getpid(),
             "bundle": str(bundle(tmp_path, {"gpuslice.io/memory": "1Gi"})), field: value}  # fmt: skip
    d = daemon()
    r = hook("createRuntime", state, d.socket)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "internal error" not in r.stderr, r.stderr
    assert f"container c1: the OCI state's {field} is" in r.stderr and (said is None or said in r.stderr), r.stderr
    assert d.client().list() == []  # nothing reserved

"""Real containers on a simulated GPU: Podman with CDI and the hook, Podman
with the runtime shim, containerd's ctr with the shim."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gpuslice_sim
from gpuslice.cli import rootfs
from gpuslice.cli.container_demo import PODMAN
from gpuslice.paths import built_executable
from tests.harness.podman_node import (
    SPEC_PATH,
    GiB,
    MiB,
    Node,
    needs_runtimes,
    podman,
    podman_detached,
    probe_result,
)
from tests.harness.references import schema_validator

pytestmark = needs_runtimes


@pytest.fixture(scope="session")
def containerd():
    sock = Path("/run/containerd/containerd.sock")
    started = None

    def answers() -> bool:  # ctr keeps dialling a socket that is not there: ask only when it is
        try:
            return sock.exists() and subprocess.run(["ctr", "version"], capture_output=True, timeout=10).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    if not answers():
        started = subprocess.Popen(["containerd"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if answers():
                break
            time.sleep(0.2)
    yield
    if started:
        started.terminate()
        started.wait(10)


@pytest.fixture
def node(daemon, tmp_path):
    n = Node(daemon, tmp_path)
    yield n
    SPEC_PATH.unlink(missing_ok=True)


def test_podman_cdi_device_with_annotations(node, root_fs):
    r = podman(["--device", "gpuslice.io/gpu=0", "--annotation", "gpuslice.io/memory=1Gi"], root_fs, [rootfs.PROBE])
    out = probe_result(r)
    assert out["total"] == GiB and out["allocated"] == GiB and out["then"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert node.wait_empty() == []


def test_a_container_running_as_a_user_other_than_root_gets_its_slice(node, tmp_path):
    """Most images and pods run as some uid other than root (USER, runAsNonRoot)."""
    root = rootfs.build(tmp_path / "root")
    root.chmod(0o755)  # an image's / as any uid reads it
    r = podman(["--device", "gpuslice.io/gpu=0", "--annotation", "gpuslice.io/memory=1Gi", "--user", "1000:1000"],
               root, [rootfs.PROBE])  # fmt: skip
    out = probe_result(r)
    assert out["total"] == GiB and out["allocated"] == GiB and out["then"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert node.wait_empty() == []


def test_a_container_with_a_read_only_root_gets_its_slice(node, tmp_path):
    """Pods run with readOnlyRootFilesystem, containers with --read-only: the hook writes the
    loader cache into the root at createContainer, before the runtime makes it read-only."""
    root = rootfs.build(tmp_path / "root")
    r = podman(["--device", "gpuslice.io/gpu=0", "--annotation", "gpuslice.io/memory=1Gi", "--read-only"],
               root, ["/bin/sh", "-c", f"touch /.x 2>/dev/null && echo writable; exec {rootfs.PROBE}"])  # fmt: skip
    assert "writable" not in r.stdout, r.stdout  # the root really is read-only to the container
    out = probe_result(r)
    assert out["total"] == GiB and out["allocated"] == GiB and out["then"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert node.wait_empty() == []


def test_podman_runtime_shim_with_annotations_only(node, root_fs):
    r = podman(
        ["--runtime", str(node.shim), "--annotation", "gpuslice.io/memory=2Gi", "--annotation", "gpuslice.io/cores=30"],
        root_fs,
        [rootfs.PROBE],
    )
    out = probe_result(r)
    assert out["total"] == 2 * GiB and out["allocated"] == 2 * GiB and out["then"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert node.wait_empty() == []


def test_ctr_with_the_shim_as_runc_binary(node, root_fs, containerd):
    cid = f"gpuslice-e2e-{os.getpid()}"
    r = subprocess.run(
        ["ctr", "run", "--rm", "--runc-binary", str(node.shim), "--annotation", "gpuslice.io/memory=1500Mi",
         "--rootfs", str(root_fs), cid, rootfs.PROBE, "100"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out = probe_result(r)
    assert out["total"] == 1500 * MiB and out["allocated"] == 1500 * MiB
    assert out["then"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert node.wait_empty() == []


@pytest.mark.parametrize(
    ("annotation", "reason"),
    [
        ("gpuslice.io/memory=lots", 'annotation gpuslice.io/memory: "lots" is not valid'),
        ("gpuslice.io/cores=150", 'annotation gpuslice.io/cores: "150" is not valid'),
        ("gpuslice.io/gpus=-1", 'annotation gpuslice.io/gpus: "-1" is not valid'),
        ("gpuslice.io/device=7", "gpuslice.io/device: no GPU 7 on this node"),
    ],
)
def test_bad_annotations_fail_the_run_and_reserve_nothing(node, root_fs, annotation, reason):
    shim = podman(["--runtime", str(node.shim), "--annotation", annotation], root_fs, [rootfs.PROBE])
    assert shim.returncode != 0 and reason in shim.stderr, shim.stderr
    assert node.client.list() == []
    cdi = podman(["--device", "gpuslice.io/gpu=0", "--annotation", annotation], root_fs, [rootfs.PROBE])
    assert cdi.returncode != 0 and "gpuslice-hook" in cdi.stderr + cdi.stdout
    assert node.client.list() == []
    assert all(g.memory_reserved == 0 for g in node.client.inventory().gpus)


def test_container_whose_poststop_never_ran_is_reclaimed(node, root_fs):
    name = f"gpuslice-orphan-{os.getpid()}"
    podman_detached(name, root_fs, 60)
    try:
        assert [s.state for s in node.client.list()] == ["bound"]
        pid = int(subprocess.run(["podman", "inspect", "--format", "{{.State.Pid}}", name], capture_output=True,
                                 text=True).stdout)  # fmt: skip
        conmon = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        os.kill(conmon, signal.SIGKILL)  # the runtime's monitor dies first: no poststop will run
        os.kill(pid, signal.SIGKILL)
        assert node.wait_empty(10) == [], "the sweep did not reclaim the slice"
    finally:
        subprocess.run(["podman", "rm", "-f", name], capture_output=True, timeout=60)


def test_generated_spec_validates_against_the_official_cdi_schema(node):
    spec = json.loads(SPEC_PATH.read_text())
    schema_validator("cdi", "schema.json").validate(spec)
    assert oct(SPEC_PATH.stat().st_mode & 0o777) == "0o644"
    assert spec["cdiVersion"] == "0.5.0"  # numeric device names need 0.5.0, which Podman 4 reads


def test_shim_config_validates_against_the_oci_schema_and_untouched_bundles_stay_byte_for_byte(node, tmp_path):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    subprocess.run(["runc", "spec", "--bundle", str(bundle)], check=True)
    before = (bundle / "config.json").read_bytes()
    stand_in = tmp_path / "stand-in-runc"
    stand_in.write_text("#!/bin/sh\nexit 0\n")  # the real runtime's part is not under test here
    stand_in.chmod(0o755)
    env = {**os.environ, "GPUSLICE_RUNTIME": str(stand_in)}

    def create(cid: str) -> None:
        r = subprocess.run(
            [str(node.shim), "create", "--bundle", str(bundle), cid], capture_output=True, text=True, env=env
        )
        assert r.returncode == 0, r.stderr

    create("untouched")
    assert (bundle / "config.json").read_bytes() == before
    config = json.loads(before)
    config["annotations"] = {"gpuslice.io/memory": "1Gi"}
    (bundle / "config.json").write_text(json.dumps(config))
    create("edited")
    edited = json.loads((bundle / "config.json").read_text())
    schema_validator("oci-runtime-spec", "config-schema.json").validate(edited)
    assert any(m["destination"] == "/usr/lib/gpuslice/wrap/libcuda.so.1" for m in edited["mounts"])
    assert edited["hooks"]["createRuntime"][0]["args"] == ["gpuslice-hook", "createRuntime"]
    assert node.client.get("edited").gpus[0].memory_limit == GiB


def test_podman_hooks_d_files_bind_and_release(node, root_fs, tmp_path):
    hooks = tmp_path / "root"
    r = subprocess.run(
        [sys.executable, "-m", "gpuslice.cli", "install", "podman", "--root", str(hooks),
         "--hook", str(built_executable("gpuslice-hook"))],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    hooks_dir = hooks / "usr/share/containers/oci/hooks.d"
    # the hooks run with the runtime's environment: point them at the test daemon
    for f in hooks_dir.glob("*.json"):
        data = json.loads(f.read_text())
        data["hook"]["env"] = [f"GPUSLICE_SOCKET={node.d.socket}"]
        f.write_text(json.dumps(data))
    name = f"gpuslice-hooksd-{os.getpid()}"
    run = subprocess.Popen(
        ["podman", "--hooks-dir", str(hooks_dir), "run", "--rm", "--name", name, *PODMAN,
         "--annotation", "gpuslice.io/memory=3Gi", "--rootfs", str(root_fs), "/bin/sleep", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    seen = []
    while not seen and time.monotonic() < deadline and run.poll() is None:
        # between Reserve and Bind the slice is "reserved": wait for the bound one
        seen = [(s.state, s.gpus[0].memory_limit) for s in node.client.list() if s.state == "bound"]
        time.sleep(0.1)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 0, err
    assert seen == [("bound", 3 * GiB)]  # createRuntime reserved and bound from the annotation
    assert node.wait_empty() == []  # poststop released it


def test_loader_cache_finds_the_interposer_without_ld_library_path(node, root_fs):
    r = podman(
        ["--device", "gpuslice.io/gpu=0", "--annotation", "gpuslice.io/memory=512Mi"],
        root_fs,
        ["/bin/sh", "-c", f"unset LD_LIBRARY_PATH; exec {rootfs.PROBE}"],
    )
    out = probe_result(r)
    assert out["total"] == 512 * MiB and out["then"] == "CUDA_ERROR_OUT_OF_MEMORY"


def test_a_containers_own_library_path_is_kept_and_the_interposer_still_found(node, root_fs):
    """The spec once set LD_LIBRARY_PATH, and a runtime applying a CDI spec replaces the
    container's own value: an image's (NGC's, Triton's, conda's) or a pod's was lost."""
    r = podman(
        ["--device", "gpuslice.io/gpu=0", "--annotation", "gpuslice.io/memory=512Mi",
         "--env", "LD_LIBRARY_PATH=/opt/app/lib"],
        root_fs,
        ["/bin/sh", "-c", f'echo "path=$LD_LIBRARY_PATH"; exec {rootfs.PROBE}'],
    )  # fmt: skip
    assert r.stdout.splitlines()[0] == "path=/opt/app/lib", r.stdout
    out = probe_result(r)
    assert out["total"] == 512 * MiB and out["then"] == "CUDA_ERROR_OUT_OF_MEMORY"


def _libcudas_loaded(r: subprocess.CompletedProcess) -> list[str]:
    """The libcuda.so.1 files a container's program loaded, in order (glibc's LD_DEBUG=libs)."""
    return re.findall(r"calling init: (\S*/libcuda\.so\.1)$", r.stderr, re.M)


def test_an_images_own_libcuda_in_its_loader_config_comes_after_the_interposer(node, tmp_path):
    """An image whose ld.so.conf.d names a directory with a libcuda.so.1 of its own (a CUDA
    compat driver; here the simulator's driver itself, which knows no slice), listed in a file
    that sorts before gpuslice's: the hook's loader cache still gives the interposer."""
    root = rootfs.build(tmp_path / "root")
    compat = root / "usr/local/cuda/compat"
    compat.mkdir(parents=True)
    shutil.copy2(gpuslice_sim.lib_dir() / "libcuda.so.1", compat / "libcuda.so.1")
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (root / "etc/ld.so.conf.d").mkdir()
    (root / "etc/ld.so.conf.d/0-cuda-compat.conf").write_text("/usr/local/cuda/compat\n")
    (root / "sbin").mkdir()
    shutil.copy2("/sbin/ldconfig", root / "sbin/ldconfig")  # static: the image's own, as Debian's
    args = ["--device", "gpuslice.io/gpu=0", "--annotation", "gpuslice.io/memory=512Mi", "--env", "LD_DEBUG=libs"]
    wrapped = ["/usr/lib/gpuslice/wrap/libcuda.so.1", "/usr/lib/gpuslice/driver/libcuda.so.1"]
    r = podman(args, root, [rootfs.PROBE])
    assert _libcudas_loaded(r) == wrapped, r.stderr[-3000:]
    out = probe_result(r)
    assert out["total"] == 512 * MiB and out["then"] == "CUDA_ERROR_OUT_OF_MEMORY"
    # once the container runs ldconfig itself (a package install does), from the configuration alone:
    # gpuslice's file first, where the image's sorts after 00-gpuslice.conf (a real image's name)
    (root / "etc/ld.so.conf.d/0-cuda-compat.conf").rename(root / "etc/ld.so.conf.d/99_cuda_compat.conf")
    again = podman(args, root, ["/bin/sh", "-c", f"/sbin/ldconfig && exec {rootfs.PROBE}"])
    assert _libcudas_loaded(again) == wrapped, again.stderr[-3000:]
    assert probe_result(again)["total"] == 512 * MiB
    # the limit this test guards: a library path naming that directory is searched before the
    # cache and loads the image's driver; only a driver that limits the container's cgroup itself
    # (the simulator's does, docs/enforcement.md) still holds it to the slice
    own_path = f"export LD_LIBRARY_PATH=/usr/local/cuda/compat; exec {rootfs.PROBE}"
    direct = podman(args, root, ["/bin/sh", "-c", own_path])
    assert _libcudas_loaded(direct) == ["/usr/local/cuda/compat/libcuda.so.1"], direct.stderr[-3000:]
    assert probe_result(direct)["total"] == 512 * MiB


@pytest.mark.measure  # a share measured over seconds: last, beside measuring tests only, under xdist
def test_the_demo_runs_three_containers_on_one_gpu():
    r = subprocess.run(
        [sys.executable, "-m", "gpuslice.cli", "demo", "--mode", "containers"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    for name, total in (("small", "2.0 GiB"), ("medium", "4.0 GiB"), ("quarter", "4.0 GiB")):
        assert f"{name:<8} sees total {total}, allocated {total}, then CUDA_ERROR_OUT_OF_MEMORY" in r.stdout
    assert "10.0 GiB / 16.0 GiB" in r.stdout  # all three slices at once in gpuslice status
    # compute: hard 20/30/50 shares through Podman, CDI and the launch gate
    for name, cores in (("twenty", 20), ("thirty", 30), ("fifty", 50)):
        m = re.search(rf"^{name}\s+share\s+{cores} %\s+measured\s+([\d.]+) %$", r.stdout, re.M)
        assert m and abs(float(m.group(1)) - cores) <= 3, r.stdout
    assert r.stdout.rstrip().endswith("daemon stopped") and "no slices" in r.stdout
    assert not Path("/var/run/cdi/gpuslice-demo.json").exists()

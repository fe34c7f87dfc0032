"""The kubelet's path: a pod with runtimeClassName gpuslice, driven through
containerd's real CRI plugin by a kubelet-like client compiled from the
official CRI proto, on containerd 1.6 (Debian 12's) and 1.7 (Debian 13's),
each configured by `gpuslice install containerd` on top of a node's own
config.  Nothing is mocked: real containerd, runc, the shim, the hook, the
daemon on the simulated GPU, and the CUDA probe inside the containers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gpuslice.cli import rootfs
from tests.clients.cri import Kubelet, compile_api
from tests.harness.containerd import PAUSE, VERSIONS, ContainerdNode, Pod, containerd_bin, cri_node, cri_sections
from tests.harness.gpu_node import GpuNode
from tests.harness.gpu_node import gpu_node as sim_gpu_node

GiB, MiB = 1 << 30, 1 << 20
SPEC_PATH = Path("/var/run/cdi/gpuslice-cri.json")
EXITED = 2  # runtime.v1.ContainerState.CONTAINER_EXITED

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("containerd", "runc", "apt-get")),
    reason="needs root, containerd, runc and apt-get (./dev.sh installs them as root)",
)


@pytest.fixture(scope="module")
def gpu_node(tmp_path_factory) -> Iterator[GpuNode]:
    with sim_gpu_node(tmp_path_factory.mktemp("daemon"), SPEC_PATH) as node:
        yield node


@pytest.fixture(scope="module")
def cri_api(tmp_path_factory):
    return compile_api(tmp_path_factory.mktemp("cri-api"))


@pytest.fixture(scope="module")
def probe_rootfs(tmp_path_factory) -> Path:
    return rootfs.build(tmp_path_factory.mktemp("probe-rootfs"))


@pytest.fixture(scope="module", params=sorted(VERSIONS))
def node(request, gpu_node, cri_api, probe_rootfs, tmp_path_factory) -> Iterator[tuple[ContainerdNode, Kubelet]]:
    """containerd of one version with the node's config plus `gpuslice install containerd`."""
    with cri_node(containerd_bin(request.param), tmp_path_factory.mktemp(f"containerd-{request.param}"),
                  gpu_node.shim, probe_rootfs, cri_api) as both:  # fmt: skip
        yield both


@pytest.fixture
def pods(node, tmp_path):
    _, kubelet = node
    made: list[Pod] = []

    def make(name: str, annotations: dict[str, str], handler: str = "gpuslice") -> Pod:
        pod = Pod(kubelet, tmp_path, name, annotations, handler)
        made.append(pod)
        return pod

    yield make
    for pod in made:
        pod.close()


def test_install_keeps_runc_the_sandbox_image_and_adds_our_runtime_class(node):
    ctd, kubelet = node
    dump = ctd.config_dump()
    assert dump.returncode == 0, dump.stderr
    cri, sandbox_image, snapshotter = cri_sections(dump.stdout)
    runtimes = cri["containerd"]["runtimes"]
    assert runtimes["runc"]["runtime_type"] == "io.containerd.runc.v2"
    assert runtimes["gpuslice"]["options"]["BinaryName"] == str(ctd.shim)
    assert runtimes["gpuslice"]["pod_annotations"] == ["gpuslice.io/*"]
    assert sandbox_image == PAUSE and snapshotter == "native"  # the node's own settings
    if ctd.version >= (1, 7):
        assert cri["enable_cdi"] is True
    version = kubelet.version()  # the CRI plugin loaded: it answers
    assert version.runtime_name == "containerd" and version.runtime_api_version == "v1"


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_uninstall_puts_the_files_back_byte_for_byte(version, tmp_path):
    ctd = ContainerdNode(containerd_bin(version), tmp_path, Path("/usr/bin/gpuslice-runtime"), tmp_path)
    etc = tmp_path / "etc"
    before = {p: p.read_bytes() for p in etc.rglob("*") if p.is_file()}
    assert ctd.install().returncode == 0
    assert (etc / "containerd/conf.d/gpuslice.toml").exists()
    r = ctd.uninstall()
    assert r.returncode == 0, r.stderr
    assert {p: p.read_bytes() for p in etc.rglob("*") if p.is_file()} == before
    assert not any((tmp_path / "var").rglob("*.json"))  # the install manifest went too


def test_pod_annotations_give_the_app_container_its_slice_and_the_sandbox_none(node, pods, gpu_node):
    _, kubelet = node
    pod = pods("probe", {"gpuslice.io/memory": "4Gi", "gpuslice.io/cores": "30"})
    assert gpu_node.slices() == []  # the sandbox (pause) container took nothing
    cid = pod.run("app")
    out = pod.probe("app")
    assert out["total"] == 4 * GiB and out["allocated"] == 4 * GiB and out["then"] == "CUDA_ERROR_OUT_OF_MEMORY"
    [held] = gpu_node.slices()
    assert held.container_id == cid and held.state == "bound" and held.gpus[0].cores == 30
    # who it serves, for the metrics: containerd's CRI wrote the pod's names into the container's annotations
    assert (held.workload.namespace, held.workload.pod, held.workload.container) == ("default", "probe", "app")
    status = subprocess.run([sys.executable, "-m", "gpuslice.cli", "status", "--socket", str(gpu_node.daemon.socket)],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert status.returncode == 0 and cid[:12] in status.stdout and pod.id[:12] not in status.stdout, status.stdout
    kubelet.stop(cid)
    assert gpu_node.wait_slices(0) == []


def test_a_container_with_a_read_only_root_gets_its_slice(node, pods, gpu_node):
    """readOnlyRootFilesystem: the hook writes the container's loader cache before runc makes
    its root read-only, so the interposer is found all the same."""
    pod = pods("readonly", {"gpuslice.io/memory": "2Gi"})
    pod.run("app", ["/bin/sh", "-c", f"touch /.x 2>/dev/null && echo writable; {rootfs.PROBE}; exec sleep 600"],
            readonly_rootfs=True)  # fmt: skip
    out = pod.probe("app")
    assert out["total"] == 2 * GiB and out["then"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert "writable" not in (pod.logs / "app.log").read_text()


def test_two_app_containers_get_two_slices_and_a_sidecar_outside_the_list_none(node, pods, gpu_node):
    pod = pods("three", {"gpuslice.io/memory": "3Gi", "gpuslice.io/containers": "trainer,eval"})
    trainer, evaluator, sidecar = pod.run("trainer"), pod.run("eval"), pod.run("log-shipper")
    assert pod.probe("trainer")["total"] == 3 * GiB and pod.probe("eval")["total"] == 3 * GiB
    assert "total" not in pod.probe("log-shipper")  # no slice, so no CDI edits: no driver in its image
    assert sorted(s.container_id for s in gpu_node.wait_slices(2)) == sorted([trainer, evaluator])
    assert sidecar not in [s.container_id for s in gpu_node.slices()]


def test_stopping_the_pod_while_it_runs_releases_its_slices(node, pods, gpu_node):
    _, kubelet = node
    pod = pods("stopped", {"gpuslice.io/memory": "2Gi"})
    pod.run("a")
    pod.run("b")
    assert len(gpu_node.wait_slices(2)) == 2
    kubelet.stop_pod(pod.id)
    assert gpu_node.wait_slices(0) == []


@pytest.mark.parametrize(
    ("annotations", "reason"),
    [
        ({"gpuslice.io/memory": "lots"}, 'annotation gpuslice.io/memory: "lots" is not valid; accepted: '),
        ({"gpuslice.io/memory": "64Gi"}, "more than any GPU holds"),
        ({"gpuslice.io/containers": "Bad_Name", "gpuslice.io/memory": "1Gi"}, "annotation gpuslice.io/containers"),
        # HAMi's use-gputype, as a pod annotation: the node's one GPU is not of that type
        (
            {"gpuslice.io/device-type": "V100", "gpuslice.io/memory": "1Gi"},
            "no GPU of this node is one the request may be given (GPU 0: gpuslice Simulated GPU, not of "
            "gpuslice.io/device-type V100)",
        ),
    ],
)
def test_a_bad_request_fails_start_container_with_the_parsers_line_and_reserves_nothing(
    node, pods, gpu_node, annotations, reason
):
    _, _kubelet = node
    pod = pods("bad", annotations)
    with pytest.raises(grpc.RpcError) as e:
        pod.run("app")
    assert reason in e.value.details(), e.value.details()  # what the kubelet reports for the pod
    assert gpu_node.slices() == []
    assert all(g.memory_reserved == 0 for g in gpu_node.daemon.client().inventory().gpus)


def test_a_gpu_type_in_the_containers_environment_is_held_at_its_start(node, pods, gpu_node):
    """What the webhook writes for HAMi's use-gputype in runtimeClass mode: the container's own
    GPUSLICE_DEVICE_TYPE, a word of the GPU's name in any case."""
    _, kubelet = node
    pod = pods("typed", {})
    cid = pod.run("app", env={"GPUSLICE_MEMORY": "1Gi", "GPUSLICE_DEVICE_TYPE": "V100, simulated"})
    assert pod.probe("app")["total"] == GiB
    assert [s.container_id for s in gpu_node.wait_slices(1)] == [cid]
    kubelet.stop(cid)
    assert gpu_node.wait_slices(0) == []


def test_a_hami_pod_rewritten_for_runtime_class_mode_starts_with_the_record_on_its_pod(node, pods, gpu_node):
    """A pod written for HAMi, as the webhook rewrites it in runtimeClass mode: the pod carries
    the webhook's record and HAMi's annotations, and the kubelet hands a pod's annotations to
    the CRI as its sandbox's (kubelet's generatePodSandboxConfig), which containerd copies into
    each container of our runtime where they match its pod_annotations (gpuslice.io/*). The
    record was gpuslice.io/rewritten-from, which the request parser refused as an unknown
    request: every such pod failed to start. It starts now, with the slice its rewritten
    environment asks."""
    import copy

    import jsonpatch

    from gpuslice.admission.rewrite import RECORD, rewrite

    _, kubelet = node
    hami = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hami", "namespace": "default",
            "annotations": {"hami.io/gpu-scheduler-policy": "spread"}}, "spec": {"containers": [{
                "name": "app", "image": "busybox",
                "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1024}}}]}}  # fmt: skip
    out = jsonpatch.apply_patch(copy.deepcopy(hami), rewrite(hami, "runtimeClass").patch)
    assert out["spec"]["runtimeClassName"] == "gpuslice" and RECORD in out["metadata"]["annotations"]
    env = {e["name"]: e["value"] for e in out["spec"]["containers"][0]["env"]}
    pod = pods("hami", out["metadata"]["annotations"])
    cid = pod.run("app", env=env)
    assert pod.probe("app")["total"] == GiB
    assert [s.container_id for s in gpu_node.wait_slices(1)] == [cid]
    kubelet.stop(cid)
    assert gpu_node.wait_slices(0) == []


def test_containerd_restarted_in_the_middle_leaks_nothing(node, pods, gpu_node):
    ctd, kubelet = node
    pod = pods("restart", {"gpuslice.io/memory": "1Gi"})
    cid = pod.run("app")
    assert [s.container_id for s in gpu_node.wait_slices(1)] == [cid]
    ctd.stop()
    ctd.start()  # the container and its shim lived on; containerd finds them again
    assert kubelet.status(cid).state != EXITED and [s.container_id for s in gpu_node.slices()] == [cid]
    kubelet.stop(cid)
    assert gpu_node.wait_slices(0) == []


def test_cdi_device_as_a_dra_driver_asks_for_it_on_the_default_runtime(node, pods, gpu_node):
    """CDI in CRI (containerd 1.7 with enable_cdi): CreateContainer with
    CDI_devices, the request in the environment, the default runc handler.
    containerd 1.6's CRI has no CDI: the device is ignored, and no slice made."""
    ctd, _ = node
    pod = pods("cdi", {}, handler="")
    cid = pod.run("app", env={"GPUSLICE_MEMORY": "1500Mi"}, cdi_devices=["gpuslice.io/gpu=0"])
    out = pod.probe("app")
    if ctd.version < (1, 7):
        assert "total" not in out and gpu_node.wait_slices(0, seconds=1) == []  # no driver, no slice
        return
    assert out["total"] == 1500 * MiB and out["then"] == "CUDA_ERROR_OUT_OF_MEMORY"
    [held] = gpu_node.wait_slices(1)
    assert held.container_id == cid and held.state == "bound"

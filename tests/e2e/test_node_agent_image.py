"""The node agent from the built image (`packaging/build.py image`), run by
podman as the chart's DaemonSet runs it: against simulated hosts with
containerd 1.6, 1.7 and 2.x configs; across an upgrade (a new image tag on
the same host) with a bound slice; and on this machine's own root, where a
pod through containerd 1.7's CRI gets its slice from what the agent installed."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslice.cli import rootfs
from tests.clients.cri import Kubelet, compile_api
from tests.harness import fake_host
from tests.harness.containerd import HOLD, VERSIONS, ContainerdNode, Pod, containerd_bin, kubelet_on
from tests.harness.node_agent import AgentRun, Dirs, check_installed, podman_command, start_image, stop_all, wait_for

GiB = 1 << 30


@pytest.fixture(autouse=True)
def _no_agent_left_running() -> Iterator[None]:
    yield
    stop_all()


pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("debootstrap", "podman", "runc", "dpkg-deb", "containerd")),
    reason="needs root, debootstrap, podman, runc, containerd and dpkg-dev (./dev.sh installs them as root)",
)


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_the_image_installs_onto_a_host_serves_and_undoes_byte_for_byte(image, version, tmp_path):
    host = fake_host.build(tmp_path / "host", tmp_path / "sim", version)
    before = host.snapshot()
    agent = start_image(image, f"gs-agent-{version.replace('.', '')}", host, tmp_path / "agent").wait_serving()
    try:
        check_installed(host, agent.spec, None)
        with agent.client() as c:  # the daemon in the container, on the host's socket
            assert len(c.inventory().gpus) == 1
    finally:
        rc = agent.stop()
    assert rc == 0, agent.text()
    assert host.snapshot() == before, agent.text()
    assert list(agent.dirs.cdi.iterdir()) == []


def test_an_upgrade_to_a_new_tag_keeps_a_bound_slice(image, tmp_path):
    host = fake_host.build(tmp_path / "host", tmp_path / "sim", "1.7")
    before = host.snapshot()
    holder = subprocess.Popen(["sleep", "600"])  # the container's process (the agent sees the host's pids)
    upgraded = image.rsplit(":", 1)[0] + ":next"
    subprocess.run(["podman", "tag", image, upgraded], check=True)
    try:
        old = start_image(image, "gs-agent-old", host, tmp_path / "agent").wait_serving()
        with old.client() as c:
            c.reserve("app", {"gpuslice.io/memory": "3Gi", "gpuslice.io/cores": "40"})
            bound = c.bind("app", holder.pid)
        assert old.stop() == 0, old.text()
        assert host.snapshot() == before  # the old agent undid its install ...
        new = start_image(upgraded, "gs-agent-new", host, tmp_path / "agent").wait_serving()
        try:
            with new.client() as c:
                [kept] = c.list()  # ... and the slice outlived it
            assert (kept.container_id, kept.state, kept.pid) == ("app", "bound", holder.pid)
            assert [(g.uuid, g.memory_limit, g.cores) for g in kept.gpus] == [(g.uuid, 3 * GiB, 40) for g in bound.gpus]
            assert (host.root / "etc/containerd/conf.d/gpuslice.toml").exists()
        finally:
            assert new.stop() == 0, new.text()
    finally:
        holder.kill()
        holder.wait()
        subprocess.run(["podman", "rmi", upgraded], capture_output=True)
    assert host.snapshot() == before


RUN_DIR = Path("/run/gpuslice")  # where the runtime shim looks


@pytest.fixture
def node_root_agent(image, tmp_path) -> Iterator[tuple[AgentRun, ContainerdNode, Kubelet, fake_host.FakeHost]]:
    """The agent on this machine's own root: its parts under a test directory,
    the driver (simulated) under --driver-root, containerd 1.7's config where
    the CRI harness keeps it, and the daemon's sockets in /run/gpuslice."""
    if RUN_DIR.exists():
        pytest.fail(f"{RUN_DIR} exists: a gpuslice daemon runs on this machine; stop it for this test")
    driver = fake_host.build(tmp_path / "driver", tmp_path / "sim", "1.7")
    probe = rootfs.build(tmp_path / "probe-rootfs")
    ctd = ContainerdNode(containerd_bin("1.7"), tmp_path / "containerd", Path("/nonexistent"), probe)
    config_before = ctd.config.read_bytes()
    dirs = Dirs(RUN_DIR, tmp_path / "agent/state", tmp_path / "agent/cdi")
    for d in (dirs.run, dirs.state, dirs.cdi):  # the chart's hostPath volumes: DirectoryOrCreate
        d.mkdir(parents=True)
    host_dir = tmp_path / "opt-gpuslice"
    log = tmp_path / "agent.log"
    cmd = podman_command(image, "gs-agent-node", Path("/"), dirs, driver.env(), [driver.sim_config.parent],
                         f"--driver-root={driver.root}", f"--runtime-config={ctd.config}", "--runtime-version=1.7",
                         host_dir=str(host_dir))  # fmt: skip
    agent = AgentRun(subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT), dirs, log,
                     ["podman", "kill", "--signal", "TERM", "gs-agent-node"])  # fmt: skip
    try:
        agent.wait_serving()
        # containerd started now reads the drop-in, as --runtime-restart has it on a node
        with kubelet_on(ctd, compile_api(tmp_path / "cri-api")) as kubelet:
            yield agent, ctd, kubelet, driver
    finally:
        rc = agent.stop()
        shutil.rmtree(RUN_DIR, ignore_errors=True)
    assert rc == 0, agent.text()
    assert ctd.config.read_bytes() == config_before and not (ctd.config.parent / "conf.d").exists()
    assert not host_dir.exists(), agent.text()


def test_a_pod_through_containerd_gets_its_slice_from_what_the_agent_installed(node_root_agent, tmp_path):
    agent, _ctd, kubelet, driver = node_root_agent
    pod = Pod(kubelet, tmp_path / "logs", "probe", {"gpuslice.io/memory": "4Gi", "gpuslice.io/cores": "30"})
    # the simulated driver's machine (a real driver needs none)
    sim = {"GPUSLICE_SIM_CONFIG": "/etc/gpuslice-sim/sim.yaml"}
    cid = pod.run("app", HOLD, env=sim, mounts={"/etc/gpuslice-sim": str(driver.sim_config.parent)})
    out = pod.probe("app")
    assert out["total"] == 4 * GiB and out["then"] == "CUDA_ERROR_OUT_OF_MEMORY", out
    with agent.client() as c:
        [held] = c.list()
        assert held.container_id == cid and held.state == "bound" and held.gpus[0].cores == 30
        assert (held.workload.namespace, held.workload.pod, held.workload.container) == ("default", "probe", "app")
        kubelet.stop(cid)
        assert wait_for(lambda: c.list() == []), agent.text()
    pod.close()

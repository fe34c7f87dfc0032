"""`gpuslice node-agent` as a process against a simulated host root (the
image's run of it is tests/e2e/test_node_agent_image.py): what it installs,
the spec naming the host's paths, containerd's merged config for each
version, the daemon answering, the spec made again when the driver changes,
and SIGTERM putting the host back byte for byte."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.harness import fake_host
from tests.harness.containerd import VERSIONS, containerd_bin
from tests.harness.node_agent import (
    Dirs,
    agent_args,
    check_installed,
    mounts_of,
    parts_built,
    start_process,
    stop_all,
    wait_for,
)


@pytest.fixture(autouse=True)
def _no_agent_left_running() -> Iterator[None]:
    yield
    stop_all()


pytestmark = pytest.mark.skipif(
    not shutil.which("containerd") or not shutil.which("apt-get"),
    reason="needs containerd and apt-get (./dev.sh installs them as root)",
)


@pytest.fixture(params=sorted(VERSIONS))
def host(request, tmp_path) -> fake_host.FakeHost:
    return fake_host.build(tmp_path / "host", tmp_path / "sim", request.param)


def test_the_agent_installs_serves_follows_the_driver_and_undoes_byte_for_byte(host, tmp_path):
    before = host.snapshot()
    agent = start_process(host, tmp_path / "agent").wait_serving()
    try:
        check_installed(host, agent.spec, parts_built())
        with agent.client() as c:
            assert len(c.inventory().gpus) == 1
            c.reserve("c1", {"gpuslice.io/memory": "2Gi"})
            assert [s.container_id for s in c.list()] == ["c1"]
        # a driver upgrade lands nvidia-smi: the spec is made again with it
        smi = host.root / "usr/bin/nvidia-smi"
        smi.write_text("#!/bin/sh\n")
        smi.chmod(0o755)
        assert wait_for(lambda: "/usr/bin/nvidia-smi" in mounts_of(agent.spec)), agent.text()
        assert mounts_of(agent.spec)["/usr/bin/nvidia-smi"] == "/usr/bin/nvidia-smi"
        smi.unlink()
        assert wait_for(lambda: "/usr/bin/nvidia-smi" not in mounts_of(agent.spec)), agent.text()
    finally:
        rc = agent.stop()
    assert rc == 0, agent.text()
    assert host.snapshot() == before  # every file, link and directory as it was
    assert list(agent.dirs.cdi.iterdir()) == []
    assert sorted(p.name for p in agent.dirs.state.iterdir()) == ["daemon.lock", "membership.key", "state.db"]
    assert "undone" in agent.text()


def test_a_second_agent_after_a_kill_keeps_the_first_view_of_the_host(host, tmp_path):
    """An agent killed (OOM, node crash) cannot undo; the next one's undo still
    restores the host as it was before either."""
    before = host.snapshot()
    first = start_process(host, tmp_path / "agent").wait_serving()
    first.proc.kill()
    first.proc.wait(30)
    second = start_process(host, tmp_path / "agent").wait_serving()
    with second.client() as c:
        assert len(c.inventory().gpus) == 1
    assert second.stop() == 0, second.text()
    assert host.snapshot() == before


@pytest.mark.parametrize(
    ("extra", "exit_code", "line"),
    [
        (
            ["--runtime-config=etc/containerd/config.toml"],
            2,
            "etc/containerd/config.toml: not an absolute path; accepted: a path on the host",
        ),
        (["--driver-root=/run/nvidia/driver"], 2, "libnvidia-ml.so.1 not found under"),
        (["--runtime-version=one"], 2, '--runtime-version: "one" is not valid; accepted: MAJOR.MINOR'),
    ],
)
def test_bad_input_is_one_line_and_leaves_the_host_as_it_was(host, tmp_path, extra, exit_code, line):
    before = host.snapshot()
    dirs = Dirs.under(tmp_path / "agent")
    r = subprocess.run([sys.executable, "-m", "gpuslice.cli", *agent_args(host.root, dirs, *extra)],
                       capture_output=True, text=True, timeout=60, env={**os.environ, **host.env()})  # fmt: skip
    assert r.returncode == exit_code, r.stderr
    [said] = [ln for ln in r.stderr.splitlines() if ln.startswith("gpuslice node-agent:")]
    assert line in said, r.stderr
    assert host.snapshot() == before
    assert list(dirs.cdi.iterdir()) == [] and not (dirs.state / "node-agent.json").exists()


def test_the_runtime_version_is_asked_of_the_hosts_binary(tmp_path):
    host = fake_host.build(tmp_path / "host", tmp_path / "sim", "1.6")
    shutil.copy2(containerd_bin("2.x") / "containerd", host.root / "usr/bin/containerd")  # the host's is 2.x
    agent = start_process(host, tmp_path / "agent").wait_serving()
    try:
        dropin = (host.root / "etc/containerd/conf.d/gpuslice.toml").read_text()
        assert "containerd 2." in dropin and "version = 3" in dropin
    finally:
        assert agent.stop() == 0

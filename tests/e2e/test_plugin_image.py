"""The kubelet plugin's container image (`packaging/build.py image`: Debian 12
by debootstrap, the .deb and Debian's kubernetes client, `podman import`),
run as the DaemonSet runs it: the node's directories mounted, the daemon's
socket reached through them, the API server over the network. A stand-in
kubelet registers it and prepares a claim through it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from gpuslice.cli import sim_daemon
from tests.harness.dra import DraNode, allocated

GiB = 1 << 30

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("debootstrap", "podman", "runc", "dpkg-deb")),
    reason="needs root, debootstrap, podman, runc and dpkg-dev (./dev.sh installs them as root)",
)


@pytest.fixture
def node(image, daemon, tmp_path) -> Iterator[DraNode]:
    d = daemon([{"memory": "16Gi"}])
    spec = tmp_path / "gpuslice.json"
    assert sim_daemon.cdi_generate(d, spec).returncode == 0
    # the node's directories at the same paths inside, as the DaemonSet's hostPath mounts do
    podman = ["podman", "--runtime", "runc", "run", "--rm", "--network", "host", "--ulimit", "nofile=1024:1024",
              "--ulimit", "nproc=1024:1024", "-v", f"{tmp_path}:{tmp_path}", "-v", f"{d.dir}:{d.dir}",
              image]  # fmt: skip
    n = DraNode(d, spec, tmp_path, tmp_path / "cdi", gpuslice=podman)
    n.start_plugin()
    yield n
    n.close()


def test_the_image_runs_the_plugin_as_the_daemonset_would(node):
    got = node.kubelet("register", str(node.registry / "gpuslice.io-reg.sock"))
    assert got["chosen"] == "v1.DRAPlugin" and got["error"] == ""
    claim = allocated("from-image", ("gpu-0", "2Gi", "25"))
    node.api.put_claim(claim)
    uid = claim["metadata"]["uid"]
    answer = node.prepare(claim)[uid]
    assert answer.get("error", "") == "" and answer["devices"][0]["cdi_device_ids"] == [f"gpuslice.io/claim={uid}-0"]
    [s] = node.d.client().list()
    assert s.container_id == f"claim-{uid}" and [(g.memory_limit, g.cores) for g in s.gpus] == [(2 * GiB, 25)]
    assert (node.claim_specs / f"gpuslice.io-claim_{uid}.json").is_file()  # written through the mount
    assert node.unprepare(claim)[uid] == {"error": ""}
    assert node.d.client().list() == []
    assert "published ResourceSlice" in node.log() and node.api.invalid == []

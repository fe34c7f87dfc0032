"""A containerd node for the kubelet's path: containerd (the system's, or one
unpacked from a newer Debian) on its own socket, root and state, configured
the way a node's admin would (sandbox image, snapshotter), then by
`gpuslice install containerd`, with a busybox image holding the CUDA probe."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.harness import wait_until_ready
from tests.harness.oci_image import write_archive

IMAGE = "docker.io/library/gpuslice-probe:1"
PAUSE = "docker.io/library/gpuslice-pause:1"
STARTED_WITHIN_S = 30


def node_config(work: Path, run: Path, version: tuple[int, int]) -> str:
    """The node's own config.toml, before gpuslice: what a kubelet node sets."""
    if version >= (2, 0):
        return f"""version = 3
root = "{work}/root"
state = "{run}/state"
[grpc]
  address = "{run}/c.sock"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "native"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE}"
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_port = "0"
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
[plugins."io.containerd.cri.v1.runtime".cni]
  conf_dir = "{work}/cni"
"""
    return f"""version = 2
root = "{work}/root"
state = "{run}/state"
[grpc]
  address = "{run}/c.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE}"
  stream_server_port = "0"
  restrict_oom_score_adj = true  # this machine may not lower a process's OOM score (as in a nested node)
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
  [plugins."io.containerd.grpc.v1.cri".cni]
    conf_dir = "{work}/cni"
"""


class ContainerdNode:
    def __init__(self, bin_dir: Path, work: Path, shim: Path, image_rootfs: Path) -> None:
        self.bin_dir = bin_dir
        self.work = work
        self.run = Path(tempfile.mkdtemp(prefix="gs-ctd-", dir="/run"))  # unix socket paths stay short
        self.config = work / "etc/containerd/config.toml"
        self.version = self._version()
        self.config.parent.mkdir(parents=True, exist_ok=True)
        self.config.write_text(node_config(work, self.run, self.version))
        self.node_config = self.config.read_text()
        self.shim = shim
        self.image_rootfs = image_rootfs
        self.proc: subprocess.Popen | None = None
        self.log = work / "containerd.log"

    @property
    def socket(self) -> Path:
        return self.run / "c.sock"

    def binary(self, name: str) -> str:
        return str(self.bin_dir / name)

    def _version(self) -> tuple[int, int]:
        from gpuslice.install import runtime_version

        return runtime_version(self.binary("containerd"))

    def install(self, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "gpuslice.cli", "install", "containerd", "--root", str(self.work),
             "--shim", str(self.shim), "--runtime-binary", self.binary("containerd"), *extra],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    def uninstall(self) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "gpuslice.cli", "uninstall", "containerd", "--root", str(self.work)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    def env(self) -> dict[str, str]:
        return {**os.environ, "PATH": f"{self.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}

    def config_dump(self) -> subprocess.CompletedProcess:
        return subprocess.run([self.binary("containerd"), "--config", str(self.config), "config", "dump"],
                              capture_output=True, text=True, timeout=60, env=self.env())  # fmt: skip

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary("containerd"), "--config", str(self.config), "--log-level", "info"],
            stdout=subprocess.DEVNULL, stderr=self.log.open("ab"), env=self.env(),
        )  # fmt: skip
        wait_until_ready(self.proc, self.log, lambda: self.socket.exists() and self.ctr("version").returncode == 0,
                         "containerd", STARTED_WITHIN_S)  # fmt: skip

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([self.binary("ctr"), "--address", str(self.socket), "-n", "k8s.io", *args],
                              capture_output=True, text=True, timeout=timeout, env=self.env())  # fmt: skip

    def import_images(self) -> None:
        for name, cmd in ((IMAGE, ["/bin/sh"]), (PAUSE, ["/bin/sleep", "86400"])):
            archive = write_archive(self.image_rootfs, name, cmd, self.work / f"{name.rsplit('/', 1)[1]}.tar")
            r = self.ctr("images", "import", "--no-unpack", str(archive))
            if r.returncode != 0:
                raise RuntimeError(f"ctr images import {name}: {r.stderr.strip()}")

    def cleanup(self) -> None:
        """Everything this node started gone: its containers' tasks, then containerd."""
        if self.proc and self.proc.poll() is None:
            for cid in self.ctr("containers", "ls", "-q").stdout.split():
                self.ctr("tasks", "kill", "-s", "SIGKILL", cid)
                self.ctr("tasks", "delete", "-f", cid)
                self.ctr("containers", "delete", cid)
        self.stop()
        subprocess.run(["umount", "-R", "-l", str(self.run)], capture_output=True)
        shutil.rmtree(self.run, ignore_errors=True)


@contextmanager
def cri_node(bin_dir: Path, work: Path, shim: Path, image_rootfs: Path, api: tuple) -> Iterator[tuple]:
    """containerd with the node's config plus `gpuslice install containerd`,
    started with its images, and a kubelet-like CRI client on it; every pod,
    container and containerd itself gone afterwards."""
    from tests.clients.cri import Kubelet

    ctd = ContainerdNode(bin_dir, work, shim, image_rootfs)
    installed = ctd.install()
    assert installed.returncode == 0, installed.stderr
    kubelet = None
    try:
        ctd.start()
        ctd.import_images()
        kubelet = Kubelet(ctd.socket, api)
        yield ctd, kubelet
    finally:
        if kubelet:
            for pod in kubelet.pods():
                kubelet.stop_pod(pod.id)
                kubelet.remove_pod(pod.id)
            kubelet.close()
        ctd.cleanup()

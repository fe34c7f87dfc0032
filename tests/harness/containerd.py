"""A containerd node for the kubelet's path: containerd (the system's, or one
unpacked from a newer Debian) on its own socket, root and state, configured
the way a node's admin would (sandbox image, snapshotter), then by
`gpuslice install containerd`, with a busybox image holding the CUDA probe."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from gpuslice.cli import rootfs
from tests.clients.cri import Kubelet, compile_api
from tests.harness import wait_until_ready
from tests.harness.debian import unpacked
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


def cri_sections(dump: str) -> tuple[dict, str, str]:
    """The CRI runtime section, the sandbox image and the snapshotter, from
    `containerd config dump` (config version 3 splits them into two plugins)."""
    plugins = tomllib.loads(dump)["plugins"]
    if "io.containerd.cri.v1.runtime" in plugins:
        images = plugins["io.containerd.cri.v1.images"]
        return plugins["io.containerd.cri.v1.runtime"], images["pinned_images"]["sandbox"], images["snapshotter"]
    cri = plugins["io.containerd.grpc.v1.cri"]
    return cri, cri["sandbox_image"], cri["containerd"]["snapshotter"]


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
        from gpuslice.cli.install import runtime_version

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
            capture_output=True,
            text=True,
            timeout=60,
        )

    def env(self) -> dict[str, str]:
        return {**os.environ, "PATH": f"{self.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}

    def config_dump(self) -> subprocess.CompletedProcess:
        return subprocess.run([self.binary("containerd"), "--config", str(self.config), "config", "dump"],
                              capture_output=True, text=True, timeout=60, env=self.env())  # fmt: skip

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary("containerd"), "--config", str(self.config), "--log-level", "info"],
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("ab"),
            env=self.env(),
        )
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

    ctd = ContainerdNode(bin_dir, work, shim, image_rootfs)
    installed = ctd.install()
    assert installed.returncode == 0, installed.stderr
    with kubelet_on(ctd, api) as kubelet:
        yield ctd, kubelet


@contextmanager
def kubelet_on(ctd: ContainerdNode, api: tuple) -> Iterator[Kubelet]:
    """containerd started with its images and a kubelet-like CRI client on it;
    every pod, container and containerd itself gone afterwards."""
    from tests.clients.cri import Kubelet

    kubelet = None
    try:
        ctd.start()
        ctd.import_images()
        kubelet = Kubelet(ctd.socket, api)
        # containerd's CRI plugin learns of an image `ctr images import` made from
        # the ImageCreate event, handled apart from the import's reply
        # (pkg/cri/server/events.go): a pod run before then pulls its sandbox image
        deadline = time.monotonic() + 60
        while not all(kubelet.has_image(ref) for ref in (IMAGE, PAUSE)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"containerd's CRI plugin never listed {IMAGE} and {PAUSE} after their import")
            time.sleep(0.05)
        yield kubelet
    finally:
        if kubelet:
            for pod in kubelet.pods():
                kubelet.stop_pod(pod.id)
                kubelet.remove_pod(pod.id)
            kubelet.close()
        ctd.cleanup()


HOLD = ["/bin/sh", "-c", f"{rootfs.PROBE}; exec /bin/sleep 600"]
# containerd 1.6: Debian 12's, the system's; 1.7: Debian 13's and 2.x: Debian
# unstable's, each unpacked beside it
VERSIONS = {"1.6": None, "1.7": "trixie", "2.x": "sid"}


def containerd_bin(version: str) -> Path:
    suite = VERSIONS[version]
    return Path("/usr/bin") if suite is None else unpacked(("containerd",), suite) / "usr/bin"


class Pod:
    """One pod on the node, with its containers' CRI logs in its own directory."""

    def __init__(self, kubelet: Kubelet, logs: Path, name: str, annotations: dict[str, str], handler: str = "gpuslice"):
        self.kubelet = kubelet
        self.logs = logs / name
        self.logs.mkdir(parents=True)
        self.id, self.config = kubelet.run_pod(name, annotations, handler, str(self.logs))

    def run(self, name: str, command: list[str] = HOLD, **kw) -> str:
        cid = self.kubelet.create(self.id, self.config, name, IMAGE, command, log_path=f"{name}.log", **kw)
        self.kubelet.start(cid)
        return cid

    def probe(self, name: str, seconds: float = 30) -> dict:
        """The CUDA probe's one JSON line, from the container's CRI log."""
        log = self.logs / f"{name}.log"
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for line in log.read_text().splitlines() if log.exists() else []:
                text = line.split(" ", 3)[-1]  # TIMESTAMP STREAM TAG text
                if text.startswith("{"):
                    return json.loads(text)
            time.sleep(0.1)
        raise AssertionError(f"no probe line in {log}: {log.read_text() if log.exists() else 'no log'}")

    def close(self) -> None:
        self.kubelet.stop_pod(self.id)
        self.kubelet.remove_pod(self.id)


@contextmanager
def cdi_kubelet(tmp_path_factory, shim: Path) -> Iterator[Kubelet]:  # type: ignore[no-untyped-def]
    """containerd 1.7 (CDI in its CRI) with the node's shim and the probe's image, and a
    kubelet-like CRI client of it: what the DRA and device-plugin end-to-end tests run pods on."""
    with cri_node(containerd_bin("1.7"), tmp_path_factory.mktemp("containerd-1.7"), shim,
                  rootfs.build(tmp_path_factory.mktemp("probe-rootfs")),
                  compile_api(tmp_path_factory.mktemp("cri-api"))) as (_, client):  # fmt: skip
        yield client


# the marker of tests that run pods on containerd 1.7 (cdi_kubelet)
NEEDS_CRI = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("containerd", "runc", "apt-get")),
    reason="needs root, containerd, runc and apt-get (./dev.sh installs them as root)",
)

"""A Docker engine for the tests: dockerd (Debian 12's 20.10, or Debian 13's
26 unpacked beside it) on its own data root, exec root, socket and containerd,
with no network set-up (--iptables=false --bridge=none) and the vfs storage
driver, configured by `gpuslice install docker`.

dockerd is given a containerd of its own (`--containerd`) rather than left to
start its managed one: dockerd takes any file at /run/containerd/containerd.sock
for a running system containerd, so a stale socket left by a killed containerd
would fail every start."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.harness import wait_until_ready

IMAGE = "gpuslice-probe:1"
STARTED_WITHIN_S = 60


class DockerNode:
    def __init__(self, bin_dirs: list[Path], work: Path, shim: Path, image_rootfs: Path) -> None:
        self.bin_dirs = bin_dirs
        self.work = work
        self.run = Path(tempfile.mkdtemp(prefix="gs-dk-", dir="/run"))  # socket paths stay short
        self.shim = shim
        self.image_rootfs = image_rootfs
        self.daemon_json = work / "etc/docker/daemon.json"
        self.proc: subprocess.Popen | None = None
        self.containerd: subprocess.Popen | None = None
        self.log = work / "dockerd.log"

    @property
    def socket(self) -> Path:
        return self.run / "docker.sock"

    def env(self) -> dict[str, str]:
        path = ":".join([*map(str, self.bin_dirs), "/usr/sbin", "/usr/bin", "/sbin", "/bin"])
        return {**os.environ, "PATH": path, "DOCKER_HOST": f"unix://{self.socket}", "DOCKER_CONFIG": str(self.work)}

    def which(self, name: str) -> str:
        found = shutil.which(name, path=self.env()["PATH"])
        assert found, f"{name} not found in {self.env()['PATH']}"
        return found

    def install(self) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "gpuslice.cli", "install", "docker", "--root", str(self.work),
             "--shim", str(self.shim), "--runtime-binary", self.which("dockerd")],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    @property
    def containerd_socket(self) -> Path:
        return self.run / "containerd.sock"

    def start_containerd(self) -> None:
        """containerd on this engine's own socket, root and state, without CRI
        (what dockerd's managed containerd would be)."""
        config = self.work / "containerd.toml"
        config.write_text(f"""version = 2
root = "{self.work}/data/containerd"
state = "{self.run}/containerd"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{self.containerd_socket}"
[ttrpc]
  address = "{self.containerd_socket}.ttrpc"
""")
        log = self.work / "containerd.log"
        command = [self.which("containerd"), "--config", str(config)]
        self.containerd = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log.open("ab"), env=self.env())
        ctr = [self.which("ctr"), "--address", str(self.containerd_socket), "version"]
        wait_until_ready(self.containerd, log, lambda: self.containerd_socket.exists() and subprocess.run(
            ctr, capture_output=True, timeout=10).returncode == 0, "containerd", STARTED_WITHIN_S)  # fmt: skip

    def start(self) -> None:
        self.start_containerd()
        self.proc = subprocess.Popen(
            [self.which("dockerd"), "--config-file", str(self.daemon_json), "--data-root", str(self.work / "data"),
             "--exec-root", str(self.run / "exec"), "--host", f"unix://{self.socket}",
             "--pidfile", str(self.run / "dockerd.pid"), "--iptables=false", "--bridge=none",
             "--storage-driver", "vfs", "--containerd", str(self.containerd_socket)],
            stdout=subprocess.DEVNULL, stderr=self.log.open("ab"), env=self.env(),
        )  # fmt: skip
        wait_until_ready(self.proc, self.log, lambda: self.socket.exists() and self.docker("version").returncode == 0,
                         "dockerd", STARTED_WITHIN_S)  # fmt: skip

    def docker(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [self.which("docker"), *args], capture_output=True, text=True, timeout=timeout, env=self.env()
        )

    def server_version(self) -> tuple[int, int]:
        out = self.docker("version", "--format", "{{.Server.Version}}").stdout.strip()
        major, minor = out.split(".")[:2]
        return int(major), int(minor)

    def import_image(self) -> None:
        archive = self.work / "probe-rootfs.tar"
        subprocess.run(["tar", "-C", str(self.image_rootfs), "-cf", str(archive), "."], check=True, timeout=120)
        r = self.docker("import", str(archive), IMAGE)
        if r.returncode != 0:
            raise RuntimeError(f"docker import: {r.stderr.strip()}")

    def cleanup(self) -> None:
        if self.proc and self.proc.poll() is None:
            ids = self.docker("ps", "-aq").stdout.split()
            if ids:
                self.docker("rm", "-f", *ids)
        for proc in (self.proc, self.containerd):  # dockerd first: it stops its containers through containerd
            stop(proc)
        subprocess.run(["umount", "-R", "-l", str(self.run)], capture_output=True)
        shutil.rmtree(self.run, ignore_errors=True)
        # vfs layers and containerd's root
        subprocess.run(["umount", "-R", "-l", str(self.work / "data")], capture_output=True)


def stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)

"""A Docker engine for the tests: dockerd (Debian 12's 20.10, or Debian 13's
26 unpacked beside it) on its own data root, exec root, socket and managed
containerd, with no network set-up (--iptables=false --bridge=none) and the
vfs storage driver, configured by `gpuslice install docker`."""

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

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.which("dockerd"), "--config-file", str(self.daemon_json), "--data-root", str(self.work / "data"),
             "--exec-root", str(self.run / "exec"), "--host", f"unix://{self.socket}",
             "--pidfile", str(self.run / "dockerd.pid"), "--iptables=false", "--bridge=none",
             "--storage-driver", "vfs"],
            stdout=subprocess.DEVNULL, stderr=self.log.open("ab"), env=self.env(),
        )  # fmt: skip
        wait_until_ready(self.proc, self.log, lambda: self.socket.exists() and self.docker("version").returncode == 0,
                         "dockerd", STARTED_WITHIN_S)  # fmt: skip

    def docker(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([self.which("docker"), *args], capture_output=True, text=True, timeout=timeout,
                              env=self.env())  # fmt: skip

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
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        subprocess.run(["umount", "-R", "-l", str(self.run)], capture_output=True)
        shutil.rmtree(self.run, ignore_errors=True)
        # vfs layers and the managed containerd's state
        subprocess.run(["umount", "-R", "-l", str(self.work / "data")], capture_output=True)

"""The packages, gpuslice (the node's) and gpuslice-sim (the simulated
driver): each built as .deb and .rpm, linted, the .rpm checked against the
.deb; the node's holds no libcuda.so.1 but the interposer's; both .debs
installed, containers run against the installed binaries on the installed
simulator, then removed and purged with nothing left behind."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import tomllib
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gpuslice.cdi.registry import Registry as CdiRegistry
from gpuslice.cli import rootfs
from gpuslice.cli.container_demo import PODMAN
from gpuslice.client import AllocatorClient
from tests.harness import REPO, build_package

ROOT = REPO
INSTALLED = Path("/usr/lib/gpuslice/python/gpuslice/_native")
SIM_INSTALLED = Path("/usr/lib/gpuslice/python/gpuslice_sim/_native")
SPEC = Path("/var/run/cdi/gpuslice-pkg.json")
DAEMON_SOCKET = "/run/gpuslice/gpuslice.sock"
GiB = 1 << 30

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("dpkg-deb", "lintian", "rpmbuild", "rpmlint", "podman")),
    reason="needs root, dpkg-dev, lintian, rpm, rpmlint and podman (./dev.sh installs them as root)",
)


@pytest.fixture(scope="module")
def packages(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    return {kind: build_package(kind, out) for kind in ("deb", "rpm", "sim-deb", "sim-rpm")}


def test_packages_are_versioned_and_lint_clean(packages):
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert packages["deb"].name.startswith(f"gpuslice_{version}_")
    assert packages["rpm"].name.startswith(f"gpuslice-{version}-1.")
    assert packages["sim-deb"].name.startswith(f"gpuslice-sim_{version}_")
    assert packages["sim-rpm"].name.startswith(f"gpuslice-sim-{version}-1.")
    for deb in (packages["deb"], packages["sim-deb"]):
        lint = subprocess.run(["lintian", str(deb)], capture_output=True, text=True)
        tags = [line for line in lint.stdout.splitlines() if re.match(r"^[EW]: ", line)]
        assert not tags, tags  # what remains is justified in packaging/lintian-overrides
    for rpm, rc in ((packages["rpm"], "rpmlintrc"), (packages["sim-rpm"], "rpmlintrc-sim")):
        rpmlint = subprocess.run(
            ["rpmlint", "-r", str(ROOT / "packaging" / rc), str(rpm)], capture_output=True, text=True
        )
        assert "0 errors, 0 warnings" in rpmlint.stdout, rpmlint.stdout  # justified in packaging/rpmlintrc*


def test_only_the_sim_package_holds_a_simulated_driver(packages):
    node, sim = deb_files(packages["deb"]), deb_files(packages["sim-deb"])
    assert sorted(f for f in node if "libcuda.so" in f or "libnvidia-ml.so" in f) == sorted(
        f"{INSTALLED}/wrap/{lib}" for lib in ("libcuda.so.1", "libnvidia-ml.so.1")
    )
    assert not [f for f in node if "gpuslice_sim" in f or f.endswith("gpuslice-sim.yaml")]
    for lib in ("libcuda.so.1", "libnvidia-ml.so.1", "gpuslice-sim.yaml"):
        assert f"{SIM_INSTALLED}/{lib}" in sim
    assert not node & sim  # no file in both: either installs and leaves alone


def deb_files(deb: Path) -> set[str]:
    out = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1].lstrip(".") for line in out.splitlines() if not line.startswith("d")}


def rpm_files(rpm: Path) -> set[str]:
    out = subprocess.run(["rpm", "-qlp", str(rpm)], capture_output=True, text=True, check=True).stdout
    return {line for line in out.splitlines() if line}


def test_rpm_matches_the_deb(packages):
    for deb_kind, rpm_kind in (("deb", "rpm"), ("sim-deb", "sim-rpm")):
        deb = {f for f in deb_files(packages[deb_kind]) if not f.startswith(("/usr/share/lintian", "/usr/share/doc"))}
        rpm = {f for f in rpm_files(packages[rpm_kind]) if not f.startswith("/usr/share/doc")}
        dirs = {f for f in rpm if f not in deb and any(d.startswith(f + "/") for d in deb)}
        assert rpm - dirs == deb, deb_kind
    scripts = subprocess.run(["rpm", "-qp", "--scripts", str(packages["rpm"])], capture_output=True, text=True).stdout
    control = subprocess.run(["dpkg-deb", "-e", str(packages["deb"]), "/tmp/gpuslice-deb-control"], check=True)
    assert control.returncode == 0
    for action, deb_script in (("gpuslice_configure", "postinst"), ("gpuslice_stop", "prerm"),
                               ("gpuslice_purge", "postrm")):  # fmt: skip
        body = Path("/tmp/gpuslice-deb-control", deb_script).read_text()
        assert action in body.rsplit("}", 1)[1]  # the deb script ends by calling it
        assert re.search(rf"\n\s*(\[.*&& )?{action}", scripts.split("gpuslice_purge() {", 1)[0] + scripts[-2000:])
    for needle in (
        "install -d -m 0700 /var/lib/gpuslice",
        "systemctl enable",
        "cdi generate",
        "rm -rf /var/lib/gpuslice",
    ):
        assert needle in scripts and needle in Path("/tmp/gpuslice-deb-control/postinst").read_text()


def _start_installed_daemon(work: Path) -> subprocess.Popen:
    sim_cfg = work / "sim.yaml"
    sim_cfg.write_text(yaml.safe_dump({"gpus": [{"memory": "16Gi"}]}))
    cfg = work / "daemon.yaml"
    # the installed defaults for the sockets: the packaged hooks.d files use them too
    cfg.write_text(yaml.safe_dump({
        "socket": DAEMON_SOCKET, "state_dir": str(work / "state"), "metrics": {"port": 0},
        "nvml": "sim", "sim": {"config": str(sim_cfg), "state_dir": str(work / "sim")}, "sweep_interval": 0.5,
    }))  # fmt: skip
    proc = subprocess.Popen(["/usr/bin/gpuslice", "daemon", "--config", str(cfg)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin"})  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with grpc.insecure_channel(f"unix:{DAEMON_SOCKET}") as ch:
                if health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
                    return proc
        except grpc.RpcError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("the installed daemon did not become healthy")


def test_installed_deb_runs_containers_then_purges_clean(packages, tmp_path):
    assert not [p for p, _, _ in CdiRegistry().specs() if p != SPEC], "another gpuslice spec is installed"
    files: list[Path] = []
    try:
        # apt resolves the distribution packages it depends on (./dev.sh preinstalls them)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        debs = [str(packages["deb"]), str(packages["sim-deb"])]
        r = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", *debs],
                           capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        for name in ("gpuslice", "gpuslice-sim"):
            listed = subprocess.run(["dpkg", "-L", name], capture_output=True, text=True).stdout.split()
            files += [Path(f) for f in listed]
        assert subprocess.run(["/usr/bin/gpuslice", "--version"], capture_output=True, text=True).stdout.strip() \
            .endswith(subprocess.run([sys.executable, "-m", "gpuslice.cli", "--version"], capture_output=True,
                                     text=True).stdout.strip().split()[-1])  # fmt: skip
        assert Path("/var/lib/gpuslice").is_dir()  # the postinst made the state directory
        work = tmp_path / "node"
        work.mkdir()
        daemon = _start_installed_daemon(work)
        try:
            gen = subprocess.run(
                ["/usr/bin/gpuslice", "cdi", "generate", "--driver", "sim", "--output", str(SPEC),
                 "--hook", "/usr/bin/gpuslice-hook", "--sim-config", str(work / "sim.yaml"),
                 "--sim-state-dir", str(work / "sim")],
                capture_output=True, text=True,
            )  # fmt: skip
            assert gen.returncode == 0, gen.stderr
            assert str(INSTALLED / "wrap/libcuda.so.1") in SPEC.read_text()  # the installed interposer
            os.environ["GPUSLICE_NATIVE_DIR"] = str(INSTALLED)
            try:
                root = rootfs.build(tmp_path / "rootfs")  # with the installed CUDA probe
            finally:
                del os.environ["GPUSLICE_NATIVE_DIR"]
            run = subprocess.run(
                ["podman", "run", "--rm", *PODMAN, "--device", "gpuslice.io/gpu=0", "--annotation",
                 "gpuslice.io/memory=1Gi", "--rootfs", str(root), rootfs.PROBE, "256"],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert run.returncode == 0, run.stderr
            assert '"total": 1073741824' in run.stdout and '"allocated": 1073741824' in run.stdout
            assert "CUDA_ERROR_OUT_OF_MEMORY" in run.stdout
            with AllocatorClient(DAEMON_SOCKET) as c:
                deadline = time.monotonic() + 10
                while c.list() and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert c.list() == []
        finally:
            SPEC.unlink(missing_ok=True)
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(20)
    finally:
        subprocess.run(["dpkg", "--purge", "gpuslice", "gpuslice-sim"], capture_output=True, timeout=300)
    for name in ("gpuslice", "gpuslice-sim"):
        status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", name], capture_output=True, text=True)
        assert "installed" not in status.stdout.replace("not-installed", ""), name
    left = [
        f for f in files if f.is_file() or (f.is_dir() and str(f).startswith(("/usr/lib/gpuslice", "/etc/gpuslice")))
    ]
    assert left == [], left[:10]
    assert not Path("/var/lib/gpuslice").exists() and not Path("/etc/gpuslice").exists()

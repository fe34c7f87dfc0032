"""The .debs under a real systemd: a Debian 12 root filesystem (debootstrap)
booted with systemd as PID 1 in a container, gpuslice and gpuslice-sim
installed before any NVIDIA driver, the driver (the installed simulator's
libraries, written where a driver package writes them) installed and upgraded
afterwards, the daemon restarted and killed, then both packages removed and
purged.

The steps run in order against one booted system: each starts from the state
the previous one left, as on a node being provisioned."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.harness import build_package

PODMAN = ["podman", "--runtime", "runc"]
# the most open files a container may have here (podman cannot give more than its own hard limit)
NOFILE_HARD = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
SPEC = "/var/run/cdi/gpuslice.json"
LIBDIR = "/usr/lib/x86_64-linux-gnu"
UNITS = ("gpuslice-daemon.service", "gpuslice-cdi.service", "gpuslice-cdi.path")
# the package's own Python, for a client of the daemon inside the booted system
CLIENT = "import sys; sys.path.insert(0, '/usr/lib/gpuslice/python'); from gpuslice.client import AllocatorClient; "

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("debootstrap", "podman", "runc", "dpkg-deb")),
    reason="needs root, debootstrap, podman, runc and dpkg-dev (./dev.sh installs them as root)",
)


SIM_INSTALLED = "/usr/lib/gpuslice/python/gpuslice_sim/_native"


@pytest.fixture(scope="module")
def debs(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("deb")
    return {"gpuslice": build_package("deb", out), "gpuslice-sim": build_package("sim-deb", out)}


class Booted:
    """A container whose PID 1 is systemd."""

    def __init__(self, name: str) -> None:
        self.name = name

    def sh(self, script: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*PODMAN, "exec", self.name, "sh", "-c", script], capture_output=True, text=True, timeout=timeout
        )

    def ok(self, script: str, timeout: float = 60) -> str:
        r = self.sh(script, timeout)
        assert r.returncode == 0, f"{script}: rc {r.returncode}\n{r.stdout}{r.stderr}"
        return r.stdout

    def cp(self, src: Path, dest: str) -> None:
        subprocess.run([*PODMAN, "cp", str(src), f"{self.name}:{dest}"], check=True, capture_output=True)

    def prop(self, unit: str, name: str) -> str:
        return self.ok(f"systemctl show -P {name} {unit}").strip()

    def python(self, code: str) -> str:
        return self.ok(f'/usr/bin/python3 -I -c "{CLIENT}{code}"')

    def journal(self, unit: str) -> str:
        return self.ok(f"journalctl -q --no-pager -o cat -u {unit}")

    def paths(self) -> set[str]:
        """Every path of the system outside the kernel's and the runtime's own."""
        out = self.ok(
            "find / -xdev \\( -path /proc -o -path /sys -o -path /dev -o -path /var/log/journal \\) -prune -o -print",
            timeout=120,
        )
        return set(out.splitlines())


def wait_for(
    what: str, check: Callable[[], bool], seconds: float = 30, explain: Callable[[], str] = lambda: ""
) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"waited {seconds} s for {what}\n{explain()}"
        time.sleep(0.25)


@pytest.fixture(scope="module")
def node(rootfs: Path) -> Iterator[Booted]:
    name = f"gpuslice-systemd-{os.getpid()}"
    argv = [*PODMAN, "run", "-d", "--name", name, "--systemd=always", "--privileged", "--network", "none",
            "--ulimit", f"nofile=1024:{NOFILE_HARD}", "--ulimit", "nproc=1024:1024", "--rootfs", f"{rootfs}:O",
            "/sbin/init"]  # fmt: skip
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    booted = Booted(name)
    try:
        # systemd answers once its bus is up
        wait_for("systemd", lambda: booted.sh("systemctl is-system-running --wait", timeout=120).stdout.strip()
                 in ("running", "degraded"), seconds=120)  # fmt: skip
        assert booted.ok("systemctl is-system-running").strip() == "running", booted.ok("systemctl --failed")
        yield booted
    finally:
        subprocess.run([*PODMAN, "rm", "-f", "-t", "0", name], capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def before_install(node: Booted) -> set[str]:
    return node.paths()


def sim_machine(node: Booted, version: str, gpus: int) -> str:
    """The simulator's description of the machine (its GPUs, its version),
    from the bundled one gpuslice-sim installed."""
    import yaml

    config = yaml.safe_load(node.ok(f"cat {SIM_INSTALLED}/gpuslice-sim.yaml"))
    config["driver_version"] = version
    config["gpus"] = [dict(config["gpus"][0], uuid=f"GPU-5e1c0a1d-{i:04d}-4000-8000-{i:012d}",
                           pci_bus_id=f"00000000:{7 + 8 * i:02X}:00.0") for i in range(gpus)]  # fmt: skip
    config["topology"] = []
    return yaml.safe_dump(config)


def install_driver(node: Booted, tmp: Path, version: str, gpus: int, slow: bool = False) -> None:
    """What a driver package writes, simulated: the machine's description first,
    the PTX JIT compiler, then the two libraries the path unit watches last, each a new
    file renamed into place, as dpkg does. `slow`: libcuda lands only once the
    unit NVML's arrival started is running and has found libcuda missing (a
    slow machine's order, which lost the spec on a fresh machine)."""
    config = tmp / "gpuslice-sim.yaml"
    config.write_text(sim_machine(node, version, gpus))
    node.cp(config, f"{LIBDIR}/gpuslice-sim.yaml.dpkg-new")
    node.ok(f"mv -f {LIBDIR}/gpuslice-sim.yaml.dpkg-new {LIBDIR}/gpuslice-sim.yaml")
    for lib in ("libnvidia-ptxjitcompiler.so.1", "libnvidia-ml.so.1", "libcuda.so.1"):
        if slow and lib == "libcuda.so.1":
            wait_for("the spec's unit waiting for libcuda", lambda: "the driver's files are incomplete; waiting"
                     in node.journal("gpuslice-cdi.service"), seconds=60)  # fmt: skip
        node.ok(f"cp {SIM_INSTALLED}/{lib} {LIBDIR}/{lib}.dpkg-new && mv -f {LIBDIR}/{lib}.dpkg-new {LIBDIR}/{lib}")


def spec_devices(node: Booted) -> list[str]:
    """The spec's devices by index, and "all" (each GPU is also named by its UUID)."""
    r = node.sh(f"cat {SPEC}")
    names = [d["name"] for d in json.loads(r.stdout)["devices"]] if r.returncode == 0 else []
    return sorted(n for n in names if not n.startswith("GPU-"))


def test_installed_before_the_driver_the_units_wait_for_it(
    node: Booted, debs: dict[str, Path], before_install: set[str]
):
    for name, deb in debs.items():
        node.cp(deb, f"/tmp/{name}.deb")
    out = node.ok("dpkg -i /tmp/gpuslice.deb /tmp/gpuslice-sim.deb 2>&1", timeout=180)
    for name in debs:
        node.ok(f"rm /tmp/{name}.deb")
    assert "no CDI spec generated (no NVIDIA driver yet)" in out
    for unit in UNITS:
        assert node.prop(unit, "UnitFileState") == "enabled", unit
    assert node.prop("gpuslice-cdi.path", "ActiveState") == "active"
    time.sleep(6)  # three of the daemon's RestartSec: a restart loop would show here
    assert node.prop("gpuslice-daemon.service", "NRestarts") == "0"
    assert node.prop("gpuslice-daemon.service", "ExecMainStatus") == "3"
    # no driver yet is not a failure: nothing failed, no start limit was reached
    assert node.ok("systemctl --failed --no-legend --plain").strip() == ""
    assert node.prop("gpuslice-cdi.path", "ActiveState") == "active"
    journal = node.journal("gpuslice-daemon.service")
    assert "gpuslice daemon: cannot read the GPUs through NVML" in journal and "Traceback" not in journal, journal
    r = node.sh("gpuslice cdi generate")
    assert r.returncode == 3 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "no CDI spec written" in r.stderr and "Traceback" not in r.stderr
    assert node.sh(f"test -e {SPEC}").returncode == 1


def test_the_driver_appearing_writes_the_spec_and_starts_the_daemon(node: Booted, tmp_path: Path):
    install_driver(node, tmp_path, "580.95.05", gpus=2, slow=True)
    units = "systemctl status --no-pager gpuslice-cdi.path gpuslice-cdi.service"
    journal = "journalctl --no-pager -o short-precise -u gpuslice-cdi.service"
    wait_for("the CDI spec", lambda: spec_devices(node) == ["0", "1", "all"],
             explain=lambda: node.sh(f"{units}; {journal}").stdout)  # fmt: skip
    wait_for("the daemon", lambda: node.prop("gpuslice-daemon.service", "ActiveState") == "active")
    wait_for("the daemon's socket", lambda: node.sh("test -S /run/gpuslice/gpuslice.sock").returncode == 0)
    status = node.ok("gpuslice status")
    assert status.count("0 B / 40.0 GiB") == 2, status
    pid = node.prop("gpuslice-daemon.service", "MainPID")
    soft, hard = node.ok(f"grep 'Max open files' /proc/{pid}/limits").split()[3:5]
    # LimitNOFILE=65536 (a pidfd per watched process), as far as this machine lets a
    # container go (systemd's default soft limit would be 1024)
    assert int(soft) == int(hard) == min(65536, NOFILE_HARD), (soft, hard)
    assert node.prop("gpuslice-cdi.path", "ActiveState") == "active"
    assert node.ok("systemctl is-system-running").strip() == "running"


def slice_of(node: Booted, container: str) -> list[int]:
    """The slice's memory limit on each of its GPUs."""
    out = node.python(f"print(*(g.memory_limit for g in AllocatorClient().get('{container}').gpus))")
    return [int(m) for m in out.split()]


def test_slices_outlive_a_restart_and_a_kill(node: Booted):
    node.python("AllocatorClient().reserve('ctr-systemd', {'gpuslice.io/memory': '3Gi', 'gpuslice.io/gpus': '2'})")
    assert slice_of(node, "ctr-systemd") == [3 << 30, 3 << 30]
    before = node.prop("gpuslice-daemon.service", "MainPID")
    node.ok("systemctl restart gpuslice-daemon.service")
    wait_for("the daemon's socket", lambda: node.sh("test -S /run/gpuslice/gpuslice.sock").returncode == 0)
    assert node.prop("gpuslice-daemon.service", "MainPID") != before
    assert slice_of(node, "ctr-systemd") == [3 << 30, 3 << 30]

    killed = node.prop("gpuslice-daemon.service", "MainPID")
    node.ok("systemctl kill -s KILL gpuslice-daemon.service")
    wait_for("the daemon's restart", lambda: node.prop("gpuslice-daemon.service", "MainPID") not in ("0", killed))
    wait_for("the daemon", lambda: node.sh("gpuslice status >/dev/null 2>&1").returncode == 0)
    assert node.prop("gpuslice-daemon.service", "NRestarts") == "1"
    assert slice_of(node, "ctr-systemd") == [3 << 30, 3 << 30]
    assert "ctr-systemd" in node.ok("gpuslice status")


def test_the_installed_selftest_passes_on_the_node(node: Booted):
    """What an operator runs after installing: the packaged selftest against
    the daemon systemd runs, the spec the path unit wrote and the driver's files."""
    # with its shares, at the packaged compute_period, each measured over 5 s (10 by default: the
    # integration tests hold the shares to the same tolerance over 3 and 5). The simulated driver finds
    # its machine beside its libcuda's file; in a slice's container view that file is a bind mount of
    # its own, so the machine is named (a real driver needs no such file)
    r = node.sh(f"GPUSLICE_SIM_CONFIG={LIBDIR}/gpuslice-sim.yaml gpuslice selftest --json --seconds 5", timeout=240)
    report = json.loads(r.stdout)
    failed = [c for c in report["checks"] if c["verdict"] == "FAIL"]
    assert r.returncode == 0 and report["passed"] and not failed, (failed, r.stderr[-2000:])
    shares = [c for c in report["checks"] if " hard share " in c["name"]]
    assert sum(c["name"].startswith("GPU ") for c in report["checks"]) - len(shares) == 2 * 17
    assert len(shares) == 2 * 2, shares
    assert "ctr-systemd" in node.ok("gpuslice status") and node.ok("gpuslice status").count("gpuslice-selftest") == 0


def test_a_driver_upgrade_regenerates_the_spec(node: Booted, tmp_path: Path):
    before = node.ok(f"stat -c %Y.%N {SPEC}")
    install_driver(node, tmp_path, "580.105.08", gpus=3)
    wait_for("the regenerated CDI spec", lambda: spec_devices(node) == ["0", "1", "2", "all"])
    assert node.ok(f"stat -c %Y.%N {SPEC}") != before
    assert node.ok("systemctl --failed --no-legend --plain").strip() == ""


def test_remove_then_purge_leave_nothing(node: Booted, before_install: set[str]):
    # gpuslice-sim first: its files go, the directories gpuslice shares with it stay
    sim_owned = set(node.ok("dpkg -L gpuslice-sim").splitlines())
    node.ok("dpkg --purge gpuslice-sim", timeout=120)
    assert {p for p in sim_owned - before_install if p in node.paths()} <= {
        "/usr/lib/gpuslice",
        "/usr/lib/gpuslice/python",
    }
    owned = set(node.ok("dpkg -L gpuslice").splitlines())
    conffiles = {line.split()[0] for line in node.ok("dpkg-query -W -f='${Conffiles}' gpuslice").splitlines() if line}
    assert conffiles == {"/etc/gpuslice/daemon.yaml"}
    node.ok("dpkg -r gpuslice", timeout=120)
    left = node.paths()
    kept = conffiles | {str(Path(c).parent) for c in conffiles}  # an admin's configuration, until purge
    assert {p for p in owned - before_install if p in left} == kept
    assert "gpuslice" not in node.ok("cat /proc/[0-9]*/cmdline | tr '\\0' ' '")  # no procps in this system
    assert node.ok("systemctl list-units --all --no-legend --plain 'gpuslice*'").strip() == ""

    node.ok("dpkg --purge gpuslice", timeout=120)
    assert not (owned - before_install) & node.paths()
    # state the package made at run time (/run is another filesystem: not in paths())
    for made in ("/var/lib/gpuslice", "/run/gpuslice", "/etc/gpuslice", SPEC):
        assert node.sh(f"test -e {made}").returncode == 1, made
    # (it exits 1 when nothing matches)
    assert node.sh("systemctl list-unit-files --no-legend --plain 'gpuslice*'").stdout.strip() == ""
    assert node.ok("systemctl --failed --no-legend --plain").strip() == ""

"""`gpuslice install|uninstall` on a scratch filesystem root."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuslice.install import ANNOTATION_REGEX

SHIM, HOOK = "/usr/bin/gpuslice-runtime", "/usr/bin/gpuslice-hook"
FILES = {
    "containerd": ["etc/containerd/config.toml", "etc/containerd/conf.d/gpuslice.toml"],
    "crio": ["etc/crio/crio.conf.d/99-gpuslice.conf"],
    "podman": [
        "usr/share/containers/oci/hooks.d/gpuslice-createruntime.json",
        "usr/share/containers/oci/hooks.d/gpuslice-poststop.json",
    ],
    "docker": ["etc/docker/daemon.json"],
}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuslice.cli", *args], capture_output=True, text=True)


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("target", sorted(FILES))
def test_install_is_idempotent_and_uninstall_undoes_it(tmp_path, target):
    root = tmp_path / "root"
    (root / "etc/containerd").mkdir(parents=True)
    (root / "etc/containerd/config.toml").write_text(
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n'
    )
    (root / "etc/docker").mkdir(parents=True)
    (root / "etc/docker/daemon.json").write_text('{"log-driver": "journald"}\n')
    before = snapshot(root)
    flags = ["--root", str(root), "--shim", SHIM, "--hook", HOOK]
    dry = cli("install", target, *flags, "--dry-run")
    assert dry.returncode == 0 and "+++" in dry.stdout
    assert snapshot(root) == before  # a dry run writes nothing
    assert cli("install", target, *flags).returncode == 0
    for f in FILES[target]:
        assert (root / f).exists(), f
    installed = snapshot(root)
    again = cli("install", target, *flags)
    assert again.stdout.strip() == f"{target}: nothing to change" and snapshot(root) == installed
    assert cli("uninstall", target, "--root", str(root)).returncode == 0
    assert snapshot(root) == before  # byte for byte, the install manifest gone too


def test_what_each_runtime_gets(tmp_path):
    root = tmp_path / "r"
    for target in FILES:
        assert cli("install", target, "--root", str(root), "--shim", SHIM, "--hook", HOOK).returncode == 0
    hook = json.loads((root / FILES["podman"][0]).read_text())
    assert hook["stages"] == ["createRuntime"] and hook["hook"]["path"] == HOOK
    assert list(hook["when"]["annotations"]) == [ANNOTATION_REGEX]
    assert ANNOTATION_REGEX.startswith("^") and ANNOTATION_REGEX.endswith("$")  # anchored
    assert json.loads((root / "etc/docker/daemon.json").read_text())["runtimes"]["gpuslice"] == {"path": SHIM}
    crio = (root / FILES["crio"][0]).read_text()
    assert f'runtime_path = "{SHIM}"' in crio and '"gpuslice.io/memory"' in crio


@pytest.mark.skipif(not shutil.which("containerd"), reason="containerd is not installed (./dev.sh installs it as root)")
def test_containerd_reads_the_drop_in_and_keeps_runc_options(tmp_path):
    root = tmp_path / "root"
    (root / "etc/containerd").mkdir(parents=True)
    cfg = root / "etc/containerd/config.toml"
    cfg.write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
                   "  SystemdCgroup = true\n")  # fmt: skip
    assert cli("install", "containerd", "--root", str(root), "--shim", SHIM).returncode == 0
    # point the import at the scratch root, as / would be on a node
    cfg.write_text(cfg.read_text().replace('"/etc/containerd', f'"{root}/etc/containerd'))
    dump = subprocess.run(["containerd", "--config", str(cfg), "config", "dump"], capture_output=True, text=True)
    assert dump.returncode == 0, dump.stderr
    section = dump.stdout.split("runtimes.gpuslice.options]", 1)[1].split("[", 1)[0]
    assert f'BinaryName = "{SHIM}"' in section and "SystemdCgroup = true" in section

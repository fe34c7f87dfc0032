"""`gpuslice install|uninstall` on a scratch filesystem root."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuslice.cli.install import ANNOTATION_REGEX

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
    cfg.write_text(
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n'
    )
    assert cli("install", "containerd", "--root", str(root), "--shim", SHIM).returncode == 0
    # point the import at the scratch root, as / would be on a node
    cfg.write_text(cfg.read_text().replace('"/etc/containerd', f'"{root}/etc/containerd'))
    dump = subprocess.run(["containerd", "--config", str(cfg), "config", "dump"], capture_output=True, text=True)
    assert dump.returncode == 0, dump.stderr
    section = dump.stdout.split("runtimes.gpuslice.options]", 1)[1].split("[", 1)[0]
    assert f'BinaryName = "{SHIM}"' in section and "SystemdCgroup = true" in section


def test_uninstall_keeps_an_admins_later_edits_and_takes_out_only_ours(tmp_path):
    root = tmp_path / "root"
    cfg = root / "etc/containerd/config.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "pause:1"\n')
    flags = ["--root", str(root), "--shim", SHIM, "--runtime-version", "1.7"]
    assert cli("install", "containerd", *flags).returncode == 0
    cfg.write_text(cfg.read_text() + "# edited by the admin\n")
    assert cli("uninstall", "containerd", "--root", str(root)).returncode == 0
    assert (
        cfg.read_text() == 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "pause:1"\n'
        "# edited by the admin\n"
    )
    assert not (root / "etc/containerd/conf.d/gpuslice.toml").exists()


@pytest.mark.parametrize(
    ("target", "files", "flags", "line"),
    [
        ("containerd", {"etc/containerd/config.toml": "[plugins.cri]\n"}, ["--runtime-version", "1.6"],
         "config version 1 is not supported; accepted: version 2 or 3"),
        ("containerd", {"etc/containerd/config.toml": "version = [\n"}, ["--runtime-version", "1.7"],
         "not valid TOML"),
        ("containerd", {}, ["--runtime-version", "one.six"], '--runtime-version: "one.six" is not valid'),
        ("containerd", {}, ["--runtime-binary", "/nonexistent/containerd"], "/nonexistent/containerd --version"),
        ("docker", {"etc/docker/daemon.json": "{runtimes"}, ["--runtime-version", "26.1"], "not valid JSON"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_changes_nothing(tmp_path, target, files, flags, line):
    root = tmp_path / "root"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    before = snapshot(root) if root.exists() else {}
    r = cli("install", target, "--root", str(root), "--shim", SHIM, *flags)
    assert r.returncode == 2 and line in r.stderr and r.stderr.startswith("gpuslice install: "), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert (snapshot(root) if root.exists() else {}) == before


@pytest.mark.parametrize(
    ("version", "marker"), [("1.6", "version = 2"), ("1.7", "enable_cdi = true"), ("2.1", "version = 3")]
)
def test_the_drop_in_follows_the_containerd_version(tmp_path, version, marker):
    root = tmp_path / "root"
    assert (
        cli("install", "containerd", "--root", str(root), "--shim", SHIM, "--runtime-version", version).returncode == 0
    )
    dropin = (root / "etc/containerd/conf.d/gpuslice.toml").read_text()
    assert marker in dropin and f"containerd {version}" in dropin
    assert (root / "etc/containerd/config.toml").read_text().startswith(("version = 2\n", "version = 3\n"))


def test_an_install_recorded_before_the_one_recorder_is_undone_byte_for_byte(tmp_path):
    """`gpuslice install` kept {"before": ..., "wrote": ...} of its own before it
    recorded through cli/host_files.py, the node agent's recorder: an uninstall
    after the upgrade reads that record and restores each file as it was."""
    root = tmp_path / "root"
    (root / "etc/docker").mkdir(parents=True)
    daemon_json = root / "etc/docker/daemon.json"
    daemon_json.write_text('{"log-driver": "journald"}\n')
    before = snapshot(root)
    assert cli("install", "docker", "--root", str(root), "--shim", SHIM, "--runtime-version", "26.1").returncode == 0
    record = root / "var/lib/gpuslice/install/docker.json"
    assert json.loads(record.read_text())["files"][str(daemon_json)]["before"]["kind"] == "file"  # the one layout
    installed = daemon_json.read_text()
    # the layout of f0844ec's install: the texts themselves
    record.write_text(json.dumps({"before": {str(daemon_json): '{"log-driver": "journald"}\n'},
                                  "wrote": {str(daemon_json): installed}}))  # fmt: skip
    r = cli("uninstall", "docker", "--root", str(root))
    assert r.returncode == 0, r.stderr
    assert snapshot(root) == before and not record.exists()

"""The runtime shim in front of a stand-in runtime that records its argv."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SHIM = Path(sys.executable).parent / "gpuslice-runtime"


def fake_runtime(tmp: Path) -> Path:
    rt = tmp / "fake-runc"
    rt.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp}/argv\nexit 7\n')
    rt.chmod(0o755)
    return rt


def run(tmp: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "GPUSLICE_RUNTIME": str(fake_runtime(tmp)), "GPUSLICE_SOCKET": str(tmp / "none.sock")}
    return subprocess.run([str(SHIM), *argv], capture_output=True, text=True, env=env)


def test_other_verbs_pass_through_with_argv_and_exit_status(tmp_path):
    argv = ["--root", "/run/x", "--log", str(tmp_path / "log"), "state", "container-1"]
    r = run(tmp_path, *argv)
    assert r.returncode == 7
    assert (tmp_path / "argv").read_text().splitlines() == argv


def test_create_without_our_annotations_leaves_the_bundle_byte_for_byte(tmp_path):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    original = b'{"ociVersion": "1.0.2", "process": {"args": ["sh"]},  "root": {"path": "rootfs"}}'
    (bundle / "config.json").write_bytes(original)
    argv = ["--log-format", "json", "create", "--bundle", str(bundle), "--pid-file", "p", "c2"]
    r = run(tmp_path, *argv)
    assert r.returncode == 7 and (tmp_path / "argv").read_text().splitlines() == argv
    assert (bundle / "config.json").read_bytes() == original


def test_bad_annotations_fail_create_with_one_line_in_the_log(tmp_path):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(
        json.dumps({"ociVersion": "1.0.2", "annotations": {"gpuslice.io/cores": "150"}})
    )
    log = tmp_path / "log.json"
    r = run(tmp_path, "--log", str(log), "--log-format", "json", "create", "-b", str(bundle), "c3")
    assert r.returncode == 1 and not (tmp_path / "argv").exists()  # the real runtime never ran
    assert r.stderr.strip().splitlines() == [
        'gpuslice-runtime: annotation gpuslice.io/cores: "150" is not valid; accepted: a whole number from 1 to 100 '
        "(100 = the whole GPU)"
    ]
    entry = json.loads(log.read_text())
    assert entry["level"] == "error" and "gpuslice.io/cores" in entry["msg"]

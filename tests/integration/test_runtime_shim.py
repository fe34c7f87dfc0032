"""The runtime shim (runtime_shim/gpuslice_runtime.c) in front of a stand-in
runtime that records its argv."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from gpuslice import request
from gpuslice.cli import sim_daemon
from tests.harness.machine import oci_bundle
from tests.harness.shim import SHIM
from tests.harness.shim import run_shim as run


def bundle_asking(tmp: Path, annotations: dict[str, str]) -> Path:
    return oci_bundle(tmp / "bundle", annotations)


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
    r = run(tmp_path, *argv)  # no daemon: a container that asks for nothing does not need one
    assert r.returncode == 7 and (tmp_path / "argv").read_text().splitlines() == argv
    assert (bundle / "config.json").read_bytes() == original


def test_bad_annotations_fail_create_with_one_line_in_the_log(tmp_path, daemon):
    d = daemon()
    bundle = bundle_asking(tmp_path, {"gpuslice.io/cores": "150"})
    log = tmp_path / "log.json"
    r = run(tmp_path, "--log", str(log), "--log-format", "json", "create", "-b", str(bundle), "c3", socket=d.socket)
    assert r.returncode == 1 and not (tmp_path / "argv").exists()  # the real runtime never ran
    assert r.stderr.strip().splitlines() == [
        'gpuslice-runtime: annotation gpuslice.io/cores: "150" is not valid; accepted: a whole number from 1 to 100 '
        "(100 = the whole GPU)"
    ]
    entry = json.loads(log.read_text())
    assert entry["level"] == "error" and "gpuslice.io/cores" in entry["msg"]
    assert d.client().list() == []


@pytest.mark.parametrize("name", sorted(request.ENV_NAMES))
def test_every_request_variable_reaches_the_daemon_and_a_bad_one_is_named(tmp_path, daemon, name):
    """Docker before 24 puts no annotations into config.json: each GPUSLICE_*
    variable must make the shim ask the daemon (a bad value proves it asked)."""
    d = daemon()
    bundle = oci_bundle(tmp_path / "bundle", {}, env=["PATH=/bin", f"{name}=bad!"])
    r = run(tmp_path, "create", "--bundle", str(bundle), "c5", socket=d.socket)
    assert r.returncode == 1 and not (tmp_path / "argv").exists()
    assert r.stderr.startswith(f'gpuslice-runtime: environment variable {name}: "bad!" is not valid; accepted: ')
    assert d.client().list() == []


def test_a_request_variable_gets_its_slice_and_an_annotation_wins_over_it(tmp_path, daemon):
    d = daemon()
    bundle = oci_bundle(
        tmp_path / "bundle", {"gpuslice.io/memory": "2Gi"}, env=["GPUSLICE_MEMORY=5Gi", "GPUSLICE_CORES=20"]
    )
    spec = tmp_path / "spec.json"
    made = sim_daemon.cdi_generate(d, spec)
    assert made.returncode == 0, made.stderr
    r = run(tmp_path, "create", "--bundle", str(bundle), "c6", socket=d.socket, spec=spec)
    assert r.returncode == 7 and (tmp_path / "argv").exists(), r.stderr  # reserved, then the real runtime ran
    [view] = d.client().list()
    assert [(g.memory_limit, g.cores) for g in view.gpus] == [(2 << 30, 20)]
    env = json.loads((bundle / "config.json").read_text())["process"]["env"]
    assert "GPUSLICE_MEMORY=5Gi" in env and any(e.startswith("GPUSLICE_DEVICE_0=GPU-") for e in env)


def test_a_request_with_no_daemon_fails_create_with_one_line(tmp_path):
    bundle = bundle_asking(tmp_path, {"gpuslice.io/memory": "1Gi"})
    log = tmp_path / "log"
    r = run(tmp_path, "--log", str(log), "create", "--bundle", str(bundle), "c4")
    assert r.returncode == 1 and not (tmp_path / "argv").exists()
    [line] = r.stderr.strip().splitlines()
    assert line.startswith(f"gpuslice-runtime: no answer from the gpuslice daemon at {tmp_path}/runtime.sock")
    assert log.read_text().strip() == line


def test_a_missing_real_runtime_is_one_line(tmp_path):
    env = {**os.environ, "GPUSLICE_RUNTIME": "no-such-runtime"}
    r = subprocess.run([str(SHIM), "state", "x"], capture_output=True, text=True, env=env)
    assert r.returncode == 1
    assert r.stderr.strip() == "gpuslice-runtime: cannot find the real runtime 'no-such-runtime' (set GPUSLICE_RUNTIME)"

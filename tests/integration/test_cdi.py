"""The CDI commands as a user runs them: generation on the simulator and
validation (the model itself: tests/unit/test_cdi.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuslice.cli", *args], capture_output=True, text=True, env=env)


def test_sim_spec_is_written_atomically_valid_and_listed(make_machine, tmp_path):
    m = make_machine()
    out = tmp_path / "cdi" / "gpuslice.json"
    r = cli("cdi", "generate", "--driver", "sim", "--output", str(out), "--sim-config", str(m.config),
            "--sim-state-dir", str(m.state_dir), "--hook", "/usr/bin/gpuslice-hook", env=m.env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    spec = json.loads(out.read_text())
    assert spec["kind"] == "gpuslice.io/gpu" and spec["cdiVersion"] == "0.5.0"
    names = [d["name"] for d in spec["devices"]]
    assert names[0] == "0" and names[1].startswith("GPU-") and names[-1] == "all"
    assert oct(out.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in out.parent.iterdir()] == ["gpuslice.json"]  # no temp file left
    edits = spec["containerEdits"]
    assert {h["hookName"] for h in edits["hooks"]} == {"createRuntime", "createContainer", "poststop"}
    # no library path: a runtime would replace the container's own with it; the hook's loader cache finds the interposer
    assert not any(e.startswith("LD_LIBRARY_PATH=") for e in edits["env"])
    mounts = {mt["containerPath"]: mt for mt in edits["mounts"]}
    assert mounts["/run/gpuslice/slice"]["options"][0] == "rw"  # the directory, not the socket
    assert any(p.startswith("/usr/lib/gpuslice/driver/libyaml") for p in mounts)  # the simulator's own needs
    assert cli("cdi", "validate", str(out)).stdout.startswith("ok: gpuslice.io/gpu, 3 devices")


def test_bad_specs_are_refused_with_reasons(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"cdiVersion": "0.3.0", "kind": "Gpuslice/gpu", "devices": [
        {"name": "0", "containerEdits": {}}, {"name": "0", "containerEdits": {"env": ["NOEQUALS"]}}]}))  # fmt: skip
    r = cli("cdi", "validate", str(bad))
    assert r.returncode == 1
    assert "devices.1.containerEdits.env.0" in r.stderr
    bad.write_text(json.dumps({"cdiVersion": "0.3.0", "kind": "gpuslice.io/gpu", "devices": [
        {"name": "0", "containerEdits": {}}, {"name": "0", "containerEdits": {}}]}))  # fmt: skip
    r = cli("cdi", "validate", str(bad))
    assert 'devices.1.name: "0" appears twice' in r.stderr
    assert (
        "cdiVersion: 0.3.0 is too low for the fields used (a device name that starts with a digit); needs 0.5.0"
        in r.stderr
    )


def test_without_a_driver_generate_daemon_and_gpus_say_so_in_one_line_and_exit_3(tmp_path):
    import ctypes.util

    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has an NVIDIA driver")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSLICE_SIM", "LD_"))}
    config = tmp_path / "daemon.yaml"
    config.write_text(
        f"socket: {tmp_path}/g.sock\nslice_socket: {tmp_path}/s/s.sock\nstate_dir: {tmp_path}/st\n"
        f"slice_files_dir: {tmp_path}/sf\nmetrics: {{port: 0}}\n"
    )
    line = (
        "cannot read the GPUs through NVML: NVML Shared Library Not Found (is the NVIDIA driver installed and loaded?)"
    )
    for argv in (
        ("cdi", "generate", "--output", str(tmp_path / "spec.json")),
        ("daemon", "--config", str(config)),
        ("gpus",),
    ):
        r = cli(*argv, env=env)
        assert r.returncode == 3, (argv, r.stderr)
        [said] = r.stderr.strip().splitlines()
        assert line in said and "Traceback" not in r.stderr
        assert said.startswith(f"gpuslice {' '.join(a for a in argv[:2] if not a.startswith('-'))}: "), said
    assert not (tmp_path / "spec.json").exists()


@pytest.mark.parametrize("first", ["libnvidia-ml.so.1", "libcuda.so.1"])
def test_generate_waits_for_a_driver_arriving_in_either_order(make_machine, tmp_path, first):
    """On a fresh machine the boot test's unit ran when NVML had landed and libcuda had not,
    and failed at once (the wait for the rest never saw the error); then systemd dropped
    libcuda's event. Whichever library lands first, generate waits for the other."""
    import gpuslice_sim

    m = make_machine()
    root = tmp_path / "root"
    libdir = root / "usr/lib/x86_64-linux-gnu"
    libdir.mkdir(parents=True)
    sim = gpuslice_sim.lib_dir()
    # NVML is whatever the loader finds in the driver's directory: the simulator's, once it lands
    env = {**m.env, "LD_LIBRARY_PATH": str(libdir)}
    out = tmp_path / "gpuslice.json"
    nvml = (sim / "libnvidia-ml.so.1").read_bytes()
    land = {
        "libnvidia-ml.so.1": lambda: (libdir / "libnvidia-ml.so.1").write_bytes(nvml),
        "libcuda.so.1": lambda: (libdir / "libcuda.so.1").write_bytes(b"\x7fELF"),
    }
    land[first]()
    proc = subprocess.Popen([sys.executable, "-m", "gpuslice.cli", "cdi", "generate", "--driver-root", str(root),
                             "--output", str(out), "--hook", "/usr/bin/gpuslice-hook"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stderr is not None
    line = proc.stderr.readline()  # the event: it waits (never a guessed time)
    assert "the driver's files are incomplete; waiting" in line, line + proc.stderr.read()
    land[next(lib for lib in land if lib != first)]()
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert "reading them again" in stderr and stdout.startswith(f"wrote {out}")
    mounts = {mt["containerPath"]: mt["hostPath"] for mt in json.loads(out.read_text())["containerEdits"]["mounts"]}
    assert mounts["/usr/lib/gpuslice/driver/libcuda.so.1"] == str(libdir / "libcuda.so.1")

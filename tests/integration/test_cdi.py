"""CDI spec generation and validation (no runtime needed)."""

from __future__ import annotations

import json
import subprocess
import sys

from gpuslice.cdi.spec import minimum_version


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
    assert "LD_LIBRARY_PATH=/usr/lib/gpuslice/wrap:/usr/lib/gpuslice/driver" in edits["env"]
    mounts = {mt["containerPath"]: mt for mt in edits["mounts"]}
    assert mounts["/run/gpuslice/slice"]["options"][0] == "rw"  # the directory, not the socket
    assert any(p.startswith("/usr/lib/gpuslice/driver/libyaml") for p in mounts)  # the simulator's own needs
    assert cli("cdi", "validate", str(out)).stdout.startswith("ok: gpuslice.io/gpu, 3 devices")


def test_real_driver_files_are_found_under_the_driver_root(make_machine, tmp_path):
    m = make_machine()
    root = tmp_path / "driver-root"
    libdir = root / "usr/lib/x86_64-linux-gnu"
    libdir.mkdir(parents=True)
    for lib in ("libcuda.so.580.95.05", "libnvidia-ml.so.580.95.05"):
        (libdir / lib).write_bytes(b"\x7fELF")
    (root / "usr/bin").mkdir(parents=True)
    smi = root / "usr/bin/nvidia-smi"
    smi.write_text("#!/bin/sh\n")
    smi.chmod(0o755)
    env = {**m.env, "GPUSLICE_SIM_CONFIG": str(m.config)}
    code = (
        "from pathlib import Path\nimport json\nfrom gpuslice import sim\nsim.activate()\n"
        "from gpuslice.allocator import inventory\nfrom gpuslice.cdi import generate as g\n"
        f"o = g.Options('nvidia', Path('{root}'), '/usr/bin/gpuslice-hook')\n"
        "print(json.dumps(g.generate(inventory.read(), o)))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    spec = json.loads(r.stdout)
    mounts = {mt["containerPath"]: mt["hostPath"] for mt in spec["containerEdits"]["mounts"]}
    assert mounts["/usr/lib/gpuslice/driver/libcuda.so.1"] == str(libdir / "libcuda.so.580.95.05")
    assert mounts["/usr/bin/nvidia-smi"] == str(smi)
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia0"}]
    missing = tmp_path / "empty-root"
    missing.mkdir()
    bad = subprocess.run(
        [sys.executable, "-c", code.replace(str(root), str(missing))], env=env, capture_output=True, text=True
    )
    assert "libcuda.so.580.95.05 not found under" in bad.stderr


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
    assert "cdiVersion: 0.3.0 is too low for the fields used; needs 0.5.0" in r.stderr


def test_minimum_versions():
    assert minimum_version({"devices": [{"name": "gpu0"}]}) == "0.3.0"
    assert minimum_version({"devices": [{"name": "0"}]}) == "0.5.0"
    assert minimum_version({"devices": [{"name": "a", "annotations": {}}]}) == "0.6.0"

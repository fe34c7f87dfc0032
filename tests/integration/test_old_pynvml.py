"""The daemon and the selftest on the oldest nvidia-ml-py pyproject.toml
admits. On an H200 node the daemon died at start because the machine's
nvidia-ml-py (13.610.43, admitted by the pin) lacked the structs of the
driver's memory limits; optional NVML features are detected, not assumed."""

from __future__ import annotations

import json
import subprocess

from gpuslice.cli import sim_daemon
from tests.harness.machine import gpu, needs_root
from tests.harness.old_pynvml import python_with_oldest

pytestmark = needs_root


def test_the_daemon_and_the_selftest_run_on_the_oldest_admitted_pynvml(tmp_path):
    py, version = python_with_oldest()
    seen = subprocess.run([py, "-c", "import pynvml; print(hasattr(pynvml, 'c_nvmlGetMemoryLimits_v1_t'))"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert seen == "False"  # the case the H200 met: a pynvml without the driver limits
    d = tmp_path / "d"
    d.mkdir()
    rd = sim_daemon.start(d, sim_daemon.write_config(d, [gpu("16Gi")]), python=py)
    try:
        assert f"driver-enforced memory limits unavailable: nvidia-ml-py {version} has no" in rd.log()
        spec = tmp_path / "gpuslice.json"
        assert sim_daemon.cdi_generate(rd, spec).returncode == 0
        status = subprocess.run(
            [py, "-m", "gpuslice.cli", "status", "--socket", str(rd.socket)], capture_output=True, text=True, timeout=60
        )
        assert status.returncode == 0, status.stderr
        assert f"driver memory limits: unavailable: nvidia-ml-py {version}" in status.stdout
        r = subprocess.run([py, "-m", "gpuslice.cli", "selftest", "--config", str(rd.config), "--json", "--no-shares",
                            "--cdi-spec", str(spec)], capture_output=True, text=True, timeout=300)  # fmt: skip
        report = json.loads(r.stdout)
        failed = [c for c in report["checks"] if c["verdict"] == "FAIL"]
        assert r.returncode == 0 and not failed, failed
        enforcement = next(c for c in report["checks"] if c["name"] == "GPU 0 enforcement")
        assert enforcement["observed"].startswith("interposer (driver memory limits unavailable: nvidia-ml-py")
    finally:
        rd.kill()

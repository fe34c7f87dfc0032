"""ASan/UBSan and TSan builds: the simulator under 8 threads allocating,
copying, launching and synchronising plus a fork (libcuda_wrap/tests/sim_stress.c),
and the slice ledger's atomics under 8 contending threads (tests/ledger_stress.c)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_stress_is_clean_under_sanitizers(tmp_path):
    r = subprocess.run(
        ["make", "-C", ROOT / "libcuda_wrap", f"BUILD={tmp_path}", "check-sanitizers"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("sim_stress: ok") == 2
    assert r.stdout.count("ledger_stress: ok") == 2

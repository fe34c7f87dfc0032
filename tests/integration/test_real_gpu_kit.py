"""The real-GPU kit on the simulator (`kit.py --sim`, the entry point run.sh
hands over to once it has installed gpuslice): its node set-up (the context's
cost measured and charged), the selftest and the driver-API steps pass, the
frameworks are skipped with the reason, and steps done are kept so that a
call cut short resumes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import REPO
from tests.harness.machine import needs_root

pytestmark = needs_root
KIT = REPO / "tools" / "real-gpu" / "kit.py"


@pytest.fixture
def kit_dirs(tmp_path: Path) -> Iterator[dict[str, Path]]:
    work = Path(tempfile.mkdtemp(prefix="gskit-", dir="/tmp"))  # sockets: a short path
    yield {"state": tmp_path / "state", "out": tmp_path / "out", "work": work}
    shutil.rmtree(work, ignore_errors=True)


def kit(dirs: dict[str, Path], *args: str) -> tuple[int, str, dict]:
    argv = [sys.executable, str(KIT), "--sim", *(f"--{k}={v}" for k, v in dirs.items()), *args]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    report = json.loads((dirs["out"] / "report.json").read_text()) if (dirs["out"] / "report.json").exists() else {}
    return r.returncode, r.stdout + r.stderr, report


def rows_of(report: dict, step: str) -> dict[str, dict]:
    return {r["name"]: r for r in report["rows"] if r["step"] == step}


@pytest.mark.measure  # the trace step measures seconds of load
def test_the_kit_on_the_simulator_passes_its_driver_steps_and_skips_the_frameworks_with_the_reason(kit_dirs):
    rc, out, report = kit(kit_dirs)
    assert rc == 0, out
    assert report["summary"]["FAIL"] == 0 and report["pending"] == []
    assert report["machine"]["context cost"].startswith("300 MiB")  # the simulated GPU's context, measured
    config = (kit_dirs["work"] / "daemon.yaml").read_text()
    assert f"context_reserve: {300 << 20}" in config  # ... and charged by the daemon per context
    selftest = rows_of(report, "selftest")
    for name in ("mem to the limit", "SIGKILL gives memory back"):
        assert selftest[f"GPU 0 {name}"]["verdict"] == "PASS", name
    assert not any("share" in name for name in selftest)  # on the simulator: test_selftest.py's
    assert all(r["verdict"] in ("PASS", "INFO") for r in selftest.values())
    api = rows_of(report, "driver-api")
    for path in ("cuMemAlloc", "cuMemCreate (VMM)"):
        for what in ("the slice's view", "OOM at the limit", "memory given back", "accounting"):
            assert api[f"cuda.bindings {path}: {what}"]["verdict"] == "PASS", what
    view = rows_of(report, "nvml-view")
    assert view["NVML inside the slice: processes"]["verdict"] == "PASS"
    assert view["NVML inside the slice: memory"]["verdict"] == "PASS"
    assert view["SIGKILL gives the holder's memory back"]["verdict"] == "PASS"
    for step in ("pytorch", "cupy", "jax", "nccl", "transformers", "cuda-graph", "shares", "share-bias", "lend", "cost",
                 "mps"):  # fmt: skip
        (row,) = rows_of(report, step).values()
        assert row["verdict"] == "SKIP" and "cudart does not run on the simulator" in row["observed"]
    md = (kit_dirs["out"] / "report.md").read_text()
    assert "| driver-api | cuda.bindings cuMemAlloc: OOM at the limit |" in md
    for name in ("selftest.json", "cdi-spec.json", "daemon.log", "trace.json"):
        assert (kit_dirs["out"] / name).is_file(), name
    assert len(list(kit_dirs["out"].iterdir())) <= 8  # what the device tool brings back
    ticks = [line for s in report["steps"] for line in s["facts"].get("controller_ticks", [])]
    assert ticks and all(re.search(r" ticks in [0-9.]+ s: mean .* late$", line) for line in ticks)  # tick times
    costs = [line for s in report["steps"] for line in s["facts"].get("costs", [])]
    assert any("fitting the costs of 2 slices" in line for line in costs), costs  # the trace's tenants, controlled
    trace = rows_of(report, "trace")
    # a tenant each, every phase the simulator runs (one of each kind: 1 + 1 + 2 + 4 + 2)
    assert len(trace) == 10 and all(r["verdict"] == "INFO" for r in trace.values())
    for name, row in trace.items():  # the driver's accounting (modelled since stop 65) against each tenant's clock
        busy = float(re.search(r"busy ([0-9.]+) % by its own clock", row["observed"]).group(1))
        accounted = float(re.search(r"NVML accounting ([0-9.]+) %", row["observed"]).group(1))
        # its clock is its GPU time in every phase, since each tenant times its kernel alone and queued (timed
        # together, a kernel's clock counted the other's turns: 84.0 against 30.7 accounted under hard 30 %;
        # timed from an idle stream, the host's launch: 49.3 against 40.0 for the 50 us duty cycle)
        assert abs(accounted - busy) <= 5, (name, row["observed"])
        assert accounted > 0, (name, row["observed"])
        # the GPU's clocks beside each phase (kit_clocks): the simulator's one clock, its power with its load
        assert re.search(r"the GPU: SM 1410 MHz \(1410-1410\), [0-9]+ W$", row["observed"]), (name, row["observed"])
    for phase in json.loads((kit_dirs["out"] / "trace.json").read_text())["phases"]:
        for cal in phase["ready"]:  # each kernel as long as asked, timed queued (the host's launch not in it)
            assert cal["kernel_us"] == pytest.approx(phase["kernel_us"], rel=0.05) and cal["uncovered"] == 0, cal
            assert cal["idle_timed_us"] > cal["kernel_us"], cal
    assert subprocess.run(["pgrep", "-f", str(kit_dirs["work"] / "daemon.yaml")]).returncode == 1  # daemon gone

    # called again, it resumes: the steps kept are not run again
    rc, out, again = kit(kit_dirs, "--only", "driver-api", "--only", "nvml-view")
    assert rc == 0 and "driver-api ..." not in out and "nvml-view ..." not in out, out
    assert rows_of(again, "driver-api") == api


def test_the_report_keeps_the_rows_of_every_call(kit_dirs):
    """On the H200 a second call's report held only its own steps: the first call's rows were lost."""
    assert kit(kit_dirs, "--only", "driver-api")[0] == 0
    rc, out, second = kit(kit_dirs, "--only", "nvml-view")
    assert rc == 0, out
    assert {r["step"] for r in second["rows"]} == {"driver-api", "nvml-view"}  # the first call's rows too
    rc, out, third = kit(kit_dirs, "--only", "driver-api", "--again")
    assert rc == 0, out
    assert {(r["step"], r["call"]) for r in third["rows"]} == {("driver-api", 1), ("nvml-view", 2), ("driver-api", 3)}
    assert [c["call"] for c in third["calls"]] == [1, 2, 3] and "--again" in third["calls"][2]["options"]
    assert all(c["gpuslice"] == third["machine"]["gpuslice"] for c in third["calls"])
    md = (kit_dirs["out"] / "report.md").read_text()
    assert "| 1 | driver-api | cuda.bindings cuMemAlloc: OOM at the limit |" in md
    assert "| 3 | driver-api | cuda.bindings cuMemAlloc: OOM at the limit |" in md
    assert "- call 2: " in md


def test_a_call_without_the_time_for_a_step_leaves_it_for_the_next(kit_dirs):
    rc, out, report = kit(kit_dirs, "--only", "selftest", "--only", "pytorch", "--budget", "30")
    assert rc == 3, out  # the selftest is allowed 60 s (it took 25-38 on a GPU): not started in a 30 s call
    assert report["pending"] == ["selftest"] and "call again to resume" in out
    assert rows_of(report, "pytorch")["pytorch"]["verdict"] == "SKIP"  # a skip costs no time: done
    assert not (kit_dirs["state"] / "steps" / "selftest.json").exists()
    rc, out, report = kit(kit_dirs, "--only", "selftest")
    assert rc == 0 and report["pending"] == [] and "selftest ..." in out, out


def test_a_daemon_setting_goes_to_this_call_s_daemon_and_a_bad_one_is_one_line(kit_dirs):
    rc, out, report = kit(kit_dirs, "--only", "driver-api", "--daemon", "compute_fit_base=even")
    assert rc == 0, out
    assert "compute_fit_base: even" in (kit_dirs["work"] / "daemon.yaml").read_text()
    assert "--daemon compute_fit_base=even" in report["calls"][-1]["options"]
    for bad, said in (("compute_fit_base=mean", "compute_fit_base: 'mean' is not one of"), ("fit", "KEY=VALUE")):
        rc, out, _ = kit(kit_dirs, "--only", "nvml-view", "--daemon", bad)
        assert rc == 2 and said in out and "Traceback" not in out, out


def test_a_bad_option_is_one_line(kit_dirs):
    r = subprocess.run([sys.executable, str(KIT), "--sim", "--state", "s", "--out", "o", "--work", "w",
                        "--only", "nonesuch"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "nonesuch" in r.stderr and "Traceback" not in r.stderr


def test_a_probe_that_does_not_answer_leaves_its_stacks_and_gate_in_the_report(daemon, tmp_path):
    sys.path.insert(0, str(KIT.parent))
    import kit_report
    import kit_slices
    import kit_steps

    from gpuslice.cli import sim_daemon
    from gpuslice.cli.selftest_node import Layout
    from gpuslice.cli.selftest_slices import slice_box

    d = daemon()
    client = d.client()
    gpu = next(g for g in client.inventory().gpus if g.index == 0)
    layout = Layout(sim_daemon.interposer_env(d))
    kit = kit_steps.Kit(client, gpu, layout, True, 0, 0.0, d.config, tmp_path / "spec.json", Path("gpuslice"),
                        tmp_path, d.slice_files_dir, d.dir / "daemon.log")  # fmt: skip
    stuck = str(REPO / "tests" / "clients" / "stuck_probe.py")
    with (
        slice_box(client, gpu, layout, {"gpuslice.io/memory": "1Gi"}) as box,
        pytest.raises(kit_slices.ProbeError, match="no answer within 3 s") as caught,
    ):
        kit_slices.run_probe(client, box, gpu.uuid, stuck, [], box.env, 3.0, gate=kit.gate(box))
    overrun = caught.value.overrun
    assert "launch gate: {" in overrun and '"tokens":' in overrun and '"next_refill_in_ns":' in overrun
    assert "py-spy" in overrun  # its dump, or why there is none
    assert "in wait_forever" in overrun  # faulthandler's Python stack, on SIGUSR1
    rows, facts = kit_steps.failed_case("transformers", "generate", "runs in a slice", caught.value)
    assert "its stacks and gate: the report's end" in rows[0].observed
    result = kit_report.StepResult("transformers", rows, 3.0, {"case": facts}, call=2)
    md = kit_report.as_markdown({}, [result], [])
    assert "## transformers (call 2): generate overran" in md and "in wait_forever" in md

"""`gpuslice selftest` on the simulator: every check runs and passes on a right
node; a node that is wrong in one way fails at that check, with exit 1; bad
input is one line; the temporary slices are gone afterwards either way."""

from __future__ import annotations

import ctypes
import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpuslice.cli import sim_daemon
from gpuslice.cli.selftest_slices import PATHS
from tests.harness.machine import gpu, needs_root

pytestmark = needs_root


def selftest(d, *args: str, spec: Path | None = None) -> tuple[int, dict]:  # type: ignore[no-untyped-def]
    argv = [sys.executable, "-m", "gpuslice.cli", "selftest", "--config", str(d.config), "--json", *args]
    if spec:
        argv += ["--cdi-spec", str(spec)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, json.loads(r.stdout)


def spec_for(d, tmp_path: Path) -> Path:  # type: ignore[no-untyped-def]
    spec = tmp_path / "gpuslice.json"
    r = sim_daemon.cdi_generate(d, spec)
    assert r.returncode == 0, r.stderr
    return spec


def verdicts(report: dict) -> dict[str, str]:
    return {c["name"]: c["verdict"] for c in report["checks"]}


@pytest.mark.measure  # the compute shares are measured over seconds of simulated load
def test_every_check_runs_and_passes_on_a_right_node(daemon, tmp_path):
    d = daemon([gpu("16Gi"), gpu("8Gi")])
    rc, report = selftest(d, "--seconds", "5", spec=spec_for(d, tmp_path))
    got = verdicts(report)
    assert rc == 0 and report["passed"], [c for c in report["checks"] if c["verdict"] == "FAIL"]
    for index in (0, 1):
        for name in ("cuMemGetInfo", "NVML memory", "SIGKILL gives memory back", "hard share 30 %",
                     "hard share 70 %", "loader finds the interposer", "cuGetProcAddress hooks",
                     "launch gate per launch", *(f"{p} to the limit" for p in PATHS)):  # fmt: skip
            assert got[f"GPU {index} {name}"] == "PASS", name
    for name in ("driver", "GPUs", "daemon", "CDI spec", "CDI spec matches the driver"):
        assert got[name] == "PASS"
    assert got["runtimes"] == "INFO"  # nothing installed on this node
    assert d.client().list() == []  # every temporary slice released


def test_its_runs_on_the_driver_s_own_libcuda_are_no_process_of_a_slice(daemon, tmp_path):
    """The launch gate's direct runs load the driver's libcuda: in the slice's pid namespace they
    were processes of its container holding GPU memory without the interposer, charged to the
    slice, named in a warning and counted as unsliced at every selftest (and killed under
    `unsliced_processes: kill`). Each run holds its context for a few of these periods."""
    d = daemon(
        [gpu("16Gi", context_memory="300Mi")],
        context_reserve="300Mi",
        driver_memory_period=0.05,
        unsliced_processes="kill",
    )
    rc, report = selftest(d, "--no-shares", spec=spec_for(d, tmp_path))
    assert rc == 0 and report["passed"], [c for c in report["checks"] if c["verdict"] == "FAIL"]
    assert verdicts(report)["GPU 0 launch gate per launch"] == "PASS"
    assert "without the interposer" not in d.log() and "killed process" not in d.log()


# what an H100 with driver 580 answered (tests/data/real-gpu/h100-2026-11-26), one sample per 200 ms
# period, the GPU's use, to the process that ran most in it, is the simulator's default, on which
# test_every_check_runs_and_passes_on_a_right_node measures both GPUs' shares (the selftest read by
# NVML gave 0.0 / 69.6 % on it, as the H100 gave 6.6 / 27.1 % and the H200 16.2 / 42.0 %)
DRIVERS = {
    # each process sampled on its own clock, 170 ms periods, no sample for a period under 1 %:
    # the reading before 36a7ce4 read 20.2 / 29.8 % on it
    "own-clocks": {"util_sample_time": "170ms", "util_stamps": "per_process", "util_zero_samples": "false"},
}


@pytest.mark.measure  # the compute shares are measured over seconds of simulated load
@pytest.mark.parametrize("driver", DRIVERS)
def test_hard_shares_hold_and_read_right_whatever_the_driver_s_per_process_samples_say(daemon, tmp_path, driver):
    """The controller holds both shares on each model of the driver's sampling, and the
    selftest reads them by each worker's work against its rate alone, not by NVML."""
    d = daemon([gpu("16Gi", **DRIVERS[driver])])
    _, report = selftest(d, "--seconds", "5", spec=spec_for(d, tmp_path))
    checks = {c["name"]: c for c in report["checks"]}
    shares = [checks[f"GPU 0 hard share {s} %"] for s in (30, 70)]
    print(f"hard 30 / 70, {driver}:", " / ".join(c["observed"] for c in shares))
    assert [c["verdict"] for c in shares] == ["PASS", "PASS"], shares


def test_a_spec_that_leaves_the_interposer_out_fails_where_the_limit_is_lost(daemon, tmp_path):
    d = daemon([gpu("16Gi")])
    spec = spec_for(d, tmp_path)
    data = json.loads(spec.read_text())
    # a library path naming the driver's directory: it comes before the loader cache, so the driver's libcuda
    # is found first, as in a container whose LD_LIBRARY_PATH names a libcuda.so.1 of its own
    data["containerEdits"]["env"].append("LD_LIBRARY_PATH=/usr/lib/gpuslice/driver")
    spec.write_text(json.dumps(data))
    rc, report = selftest(d, "--no-shares", spec=spec)
    got = verdicts(report)
    assert rc == 1 and not report["passed"]
    assert got["GPU 0 loader finds the interposer"] == "FAIL"
    assert got["GPU 0 cuMemGetInfo"] == "FAIL"  # the whole GPU, not the slice
    assert all(got[f"GPU 0 {p} to the limit"] == "FAIL" for p in PATHS)
    # each failed fill says what the slice's total was made of: no process of it ever attached
    observed = {c["name"]: c["observed"] for c in report["checks"]}
    for p in PATHS:
        assert re.search(r"; then the slice: \d+ used, 0 processes attached, driver-side \d+$",
                         observed[f"GPU 0 {p} to the limit"]), observed[f"GPU 0 {p} to the limit"]  # fmt: skip
    assert got["GPU 0 cuGetProcAddress hooks"] == "FAIL"  # the driver's own functions
    assert got["CDI spec"] == "PASS" and got["daemon"] == "PASS"
    assert d.client().list() == []


def test_a_spec_for_another_driver_stops_before_any_slice(daemon, tmp_path):
    d = daemon([gpu("16Gi")])
    spec = spec_for(d, tmp_path)
    data = json.loads(spec.read_text())
    stale = tmp_path / "old-driver" / "libcuda.so.1"
    for m in data["containerEdits"]["mounts"]:
        if m["containerPath"].endswith("/driver/libcuda.so.1"):
            m["hostPath"] = str(stale)
    spec.write_text(json.dumps(data))
    rc, report = selftest(d, spec=spec)
    got = verdicts(report)
    assert rc == 1 and got["CDI spec matches the driver"] == "FAIL"
    observed = next(c["observed"] for c in report["checks"] if c["name"] == "CDI spec matches the driver")
    assert str(stale) in observed
    assert not any(name.startswith("GPU 0") for name in got)  # no slice on a node whose spec is wrong
    assert d.client().list() == []


def tgkill(pid: int, tid: int, signum: int) -> None:
    if ctypes.CDLL(None, use_errno=True).tgkill(pid, tid, signum) != 0:
        raise OSError(ctypes.get_errno(), f"tgkill {pid} {tid}")


@pytest.mark.parametrize("to", ["the process", "a GPU's thread"])
def test_stopped_halfway_it_releases_its_slices(daemon, tmp_path, to):
    """Both GPUs' checks run at once, each in its own thread; the signal reaches one
    thread, and every GPU's slices go, long before their 60 s windows would end. The
    kernel may give a process's SIGTERM to any thread: given to a GPU's thread, the
    selftest's own Python handler ran only once the main thread woke, when that GPU's
    checks ended (tests/unit/test_stop_signals.py shows it)."""
    d = daemon([gpu("16Gi"), gpu("16Gi")])
    argv = [sys.executable, "-m", "gpuslice.cli", "selftest", "--config", str(d.config), "--cdi-spec",
            str(spec_for(d, tmp_path)), "--seconds", "60"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while len(d.client().list()) < 4:  # each GPU's two share slices: the memory checks are done
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    proc.send_signal(signal.SIGUSR1)  # a selftest that seems stuck says where each thread is, and goes on
    deadline = time.monotonic() + 30
    while "_gpu_checks" not in "".join(lines):  # the dump is there before it is stopped
        assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
        time.sleep(0.05)
    if to == "the process":
        proc.send_signal(signal.SIGTERM)
    else:  # the tid from the dump's "(selftest-gpu_1, tid N)"
        tid = re.search(r"\(selftest-gpu_\d+, tid (\d+)\)", "".join(lines))
        assert tid, "".join(lines)
        tgkill(proc.pid, int(tid.group(1)), signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:  # where each of its threads is, then its end
        proc.send_signal(signal.SIGUSR1)
        time.sleep(2)
        proc.kill()
        reader.join(10)
        pytest.fail("not stopped within 30 s of SIGTERM; its stderr:\n" + "".join(lines))
    reader.join(10)
    err = "".join(lines)
    assert proc.returncode == 1 and "stopped by SIGTERM; its slices were released" in err, err
    assert "Traceback" not in err
    assert err.count("Thread 0x") >= 3 and "_gpu_checks" in err, err  # the main thread and each GPU's
    assert d.client().list() == []


def test_without_the_daemon_it_says_so_and_fails(daemon, tmp_path):
    d = daemon([gpu("16Gi")])
    spec = spec_for(d, tmp_path)
    d.kill()
    rc, report = selftest(d, spec=spec)
    daemon_row = next(c for c in report["checks"] if c["name"] == "daemon")
    assert rc == 1 and daemon_row["verdict"] == "FAIL" and "cannot reach it" in daemon_row["observed"]


@pytest.mark.parametrize("memory", ["lots", "100Mi", "1000Mi"])
def test_a_bad_memory_size_is_one_line_and_reserves_nothing(daemon, memory):
    d = daemon([gpu("16Gi")])
    r = subprocess.run([sys.executable, "-m", "gpuslice.cli", "selftest", "--config", str(d.config), "--memory",
                        memory], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--memory" in r.stderr or "lots" in r.stderr
    assert d.client().list() == []


@pytest.mark.measure  # the shares run too: their slices must have room for the context
def test_a_node_that_charges_each_context_passes_with_the_context_counted(daemon, tmp_path):
    # a driver whose contexts cost 300 MiB, charged by the daemon as context_reserve (as on a real
    # GPU): each worker's slice holds its context besides what it allocates
    d = daemon([gpu("16Gi", context_memory="300Mi")], context_reserve="300Mi")
    rc, report = selftest(d, "--seconds", "3", spec=spec_for(d, tmp_path))
    got = verdicts(report)
    assert rc == 0 and report["passed"], [c for c in report["checks"] if c["verdict"] == "FAIL"]
    for name in ("SIGKILL gives memory back", "hard share 30 %", *(f"{p} to the limit" for p in PATHS)):
        assert got[f"GPU 0 {name}"] == "PASS", name
    killed = next(c for c in report["checks"] if c["name"] == "GPU 0 SIGKILL gives memory back")
    assert killed["observed"].startswith(f"{((1024 - 300) // 2 + 300) << 20} held")  # half the room, and the context
    assert d.client().list() == []


def test_a_slice_too_small_for_the_context_is_one_failed_check(daemon, tmp_path):
    d = daemon([gpu("16Gi", context_memory="300Mi")], context_reserve="1000Mi")
    rc, report = selftest(d, "--no-shares", spec=spec_for(d, tmp_path))
    row = next(c for c in report["checks"] if c["name"] == "GPU 0 slice")
    assert rc == 1 and "context_reserve" in row["observed"]
    assert d.client().list() == []


@pytest.mark.parametrize("at", [0.25, 0.5, 0.75])
def test_killed_with_sigkill_it_leaves_no_process_and_its_slices_are_reclaimed(daemon, tmp_path, at):
    """Its pid namespaces outlived a SIGKILLed selftest by up to 600 s, their
    workers still loading the GPU and their slices bound."""
    d = daemon([gpu("16Gi")], sweep_interval=0.2, reservation_timeout=1)
    spec = spec_for(d, tmp_path)
    run_s = 9.0  # about what `--seconds 5` takes here: the memory checks, then 3 s settling and 5 s of shares
    argv = [sys.executable, "-m", "gpuslice.cli", "selftest", "--config", str(d.config), "--cdi-spec", str(spec),
            "--seconds", "5", "--json"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    time.sleep(run_s * at)
    assert proc.poll() is None
    proc.kill()
    proc.wait(10)
    deadline = time.monotonic() + 5
    while (d.client().list() or namespaces_of(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert d.client().list() == [] and namespaces_of(proc.pid) == []


def namespaces_of(sid: int) -> list[str]:
    """The selftest's session's processes still alive (its pid namespaces and their workers)."""
    r = subprocess.run(["ps", "-o", "pid=,args=", "--sid", str(sid)], capture_output=True, text=True)
    return [line for line in r.stdout.splitlines() if line.strip()]


def test_slices_see_the_driver_as_a_container_does(daemon, tmp_path):
    """On the H200 the probes ran with the host's whole driver directory on the loader's path,
    so a library the CDI spec did not mount could not be missed. Now each slice's mount
    namespace has what the spec mounts and the host's driver hidden: a spec without the PTX JIT
    compiler's library fails the PTX row (the simulator's libcuda loads its stand-in to compile
    PTX, as the real one does), and passes with it."""
    d = daemon([gpu("16Gi")])
    spec = spec_for(d, tmp_path)
    rc, report = selftest(d, "--no-shares", spec=spec)
    got = verdicts(report)
    assert rc == 0 and got["GPU 0 PTX JIT"] == "PASS", [c for c in report["checks"] if c["verdict"] == "FAIL"]
    data = json.loads(spec.read_text())
    data["containerEdits"]["mounts"] = [
        m for m in data["containerEdits"]["mounts"] if "ptxjitcompiler" not in m["containerPath"]
    ]
    spec.write_text(json.dumps(data))
    rc, report = selftest(d, "--no-shares", spec=spec)
    ptx = next(c for c in report["checks"] if c["name"] == "GPU 0 PTX JIT")
    assert rc == 1 and ptx["verdict"] == "FAIL" and "CUDA_ERROR_JIT_COMPILER_NOT_FOUND" in ptx["observed"], ptx
    assert verdicts(report)["GPU 0 mem to the limit"] == "PASS"  # the rest of the driver is there
    assert d.client().list() == []

"""ASan/UBSan and TSan builds: the simulator under 8 threads allocating,
copying, launching and synchronising plus a fork (sim/tests/sim_stress.c),
the slice ledger's atomics under 8 contending threads (libcuda_wrap/tests/ledger_stress.c),
the interposer itself (libcuda and NVML) attached to a slice, in front of the simulator
built alike, under 8 threads on every allocation path, the launch gate, graphs and contexts
plus a fork, while 2 more read the slice through NVML (libcuda_wrap/tests/wrap_stress.c);
ASan/UBSan builds of the OCI hook and the runtime shim on each of their paths."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

import gpuslice_sim
from gpuslice.allocator.slice_files import SliceFiles
from tests.harness import REPO, interposer_env
from tests.harness.machine import Agent, gpu, needs_root, oci_bundle

ROOT = REPO


def test_stress_is_clean_under_sanitizers(tmp_path):
    r = subprocess.run(
        ["make", "-C", ROOT, f"BUILD={tmp_path}", "check-sanitizers"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("sim_stress: ok") == 2
    assert r.stdout.count("ledger_stress: ok") == 2


@needs_root
@pytest.mark.parametrize("sanitizer", ["asan", "tsan"])
def test_the_interposer_in_a_slice_is_clean_under_sanitizers(tmp_path, daemon, containers, started, sanitizer):
    """The interposer's own code (its allocation table, context cache, launch gate, graph
    costs and attach) under 8 threads and a forked child of 4, attached to a hard 30 %
    slice, and its NVML side read by 2 more threads while a process outside the slice
    holds memory and launches: the stress says ok (every NVML answer the slice's, no row of
    the outsider's in the caller's arrays), the gate made launches wait (its slow path
    ran), and the slice ends with nothing charged."""
    build = tmp_path / "build"
    r = subprocess.run(["make", "-C", ROOT, f"BUILD={build}", f"{build}/{sanitizer}/wrap/wrap_stress"],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    d = daemon([gpu("16Gi")])
    client = d.client()
    box = containers()
    reserved = client.reserve("box", {"gpuslice.io/memory": "2Gi", "gpuslice.io/cores": "30",
                                      "gpuslice.io/compute-policy": "hard"})  # fmt: skip
    client.bind("box", box.init_pid)
    files = SliceFiles(d.slice_files_dir, reserved.id)
    control = Agent({**interposer_env(d), "LD_LIBRARY_PATH": str(gpuslice_sim.lib_dir())})
    started.append(control)
    assert control.call("accounting", enable=True) == {"pids": [], "stats": {}}  # records for all that follow
    outsider = Agent({**interposer_env(d), "GPUSLICE_ALLOW_UNSLICED": "1"})
    started.append(outsider)
    outsider.call("init")
    outsider.call("alloc", path="mem", size=64 << 20)
    outsider.call("launch_for", seconds=600.0)  # busy until it is closed: samples of its own in every period
    env = {**interposer_env(d), "GPUSLICE_REAL_LIBCUDA": str(build / sanitizer / "libcuda.so.1"),
           "GPUSLICE_REAL_LIBNVML": str(build / sanitizer / "libnvidia-ml.so.1"),
           "ASAN_OPTIONS": "exitcode=99", "UBSAN_OPTIONS": "halt_on_error=1:exitcode=99",
           "TSAN_OPTIONS": "halt_on_error=1:exitcode=99"}  # fmt: skip
    env.pop("LD_LIBRARY_PATH")  # the stress finds the sanitized interposer beside it
    argv = ["setarch", "-R", str(build / sanitizer / "wrap/wrap_stress")]  # TSan needs a fixed address layout
    r = subprocess.run(box.command(argv), capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and "wrap_stress: ok (slice total 2147483648;" in r.stdout, r.stdout + r.stderr[-6000:]
    outsider.proc.kill()  # its launch loop would outlive the stdin that ends an agent
    assert int(r.stdout.split("; ")[1].split()[0]) > 0  # NVML rounds answered while the workers ran
    assert "Sanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr[-6000:]
    assert files.gate_waits(0) > 0
    assert files.used()[0] == 0


def test_hook_and_shim_are_clean_under_asan_and_ubsan(tmp_path, daemon):
    """The OCI hook's and the runtime shim's paths (success, each kind of error,
    the JSON log) with ASan/UBSan builds, leaks included."""
    build = tmp_path / "build"
    r = subprocess.run(["make", "-C", ROOT, f"BUILD={build}", "asan-bin"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    hook, shim = build / "asan/bin/gpuslice-hook", build / "asan/bin/gpuslice-runtime"
    d = daemon()
    env = {**os.environ, "GPUSLICE_SOCKET": str(d.socket), "GPUSLICE_RUNTIME": "/bin/true",
           "ASAN_OPTIONS": "exitcode=99", "UBSAN_OPTIONS": "halt_on_error=1:exitcode=99"}  # fmt: skip

    asks = oci_bundle(tmp_path / "asks", {"gpuslice.io/memory": "1Gi"})
    bad = oci_bundle(tmp_path / "bad", {"gpuslice.io/cores": "150"})
    plain = oci_bundle(tmp_path / "plain", {})
    state = json.dumps({"id": "san", "pid": os.getpid(), "bundle": str(asks)})
    broken = oci_bundle(tmp_path / "broken", {"gpuslice.io/memory": "1Gi"})
    (broken / "rootfs/etc/ld.so.cache/x").mkdir(parents=True)  # ldconfig fails and says why: read back
    broken_state = json.dumps({"id": "san2", "pid": os.getpid(), "bundle": str(broken)})
    log = tmp_path / "log.json"
    runs = [
        ([hook, "update-ldcache"], state, env, 0),
        ([hook, "update-ldcache"], broken_state, env, 1),
        ([hook, "createRuntime"], "{not json", env, 1),
        ([hook, "poststop"], state, env, 0),
        ([hook, "prestart"], "", env, 2),
        ([hook, "createRuntime"], state, {**env, "GPUSLICE_SOCKET": str(tmp_path / "none.sock")}, 1),
        ([shim, "--log", log, "--log-format", "json", "create", "-b", bad, "c1"], "", env, 1),
        ([shim, "--root", "/run/x", "create", "--bundle", plain, "--pid-file", "p", "c2"], "", env, 0),
        ([shim, "state", "c3"], "", env, 0),
        ([shim, "state", "c4"], "", {**env, "GPUSLICE_RUNTIME": "no-such-runtime"}, 1),
    ]
    for argv, stdin, run_env, code in runs:
        r = subprocess.run([str(a) for a in argv], input=stdin, capture_output=True, text=True, env=run_env, timeout=60)
        assert r.returncode == code and "Sanitizer" not in r.stderr and "runtime error" not in r.stderr, (argv, r)
    assert json.loads(log.read_text())["level"] == "error"

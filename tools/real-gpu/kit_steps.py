"""The kit's steps, in order. Each runs its probes in temporary slices and
turns what it saw into rows; the rules that judge are the pure functions at
the top (tested on recorded outcomes, tests/unit/test_real_gpu_kit.py)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import kit_accounting
import kit_clocks
import kit_mps
import kit_trace
from kit_node import LogLines
from kit_report import Row, StepResult, check, skipped
from kit_slices import RECLAIM_S, Gate, Outcome, Probe, ProbeError, Sample, run_probe, wait_released, without_interposer
from probes.common import CHUNK  # what probes allocate at a time: the tolerance at the limit

from gpuslice import request
from gpuslice.allocator.slice_files import SliceFiles
from gpuslice.cli.selftest_node import Layout
from gpuslice.cli.selftest_slices import Box, WorkerError, slice_box, sm_use
from gpuslice.client import AllocatorClient
from gpuslice.inventory import Gpu

MiB, GiB = 1 << 20, 1 << 30
SHARE_POINTS = 3.0  # the selftest's tolerance for a share, in percentage points
FOUR_POINTS = 2.0  # four tenants' (10/20/30/40), as issue 46 holds them on a real GPU
FAILURES = (ProbeError, WorkerError, grpc.RpcError, OSError, subprocess.TimeoutExpired, KeyError, ValueError)
NO_CUDART = "cudart does not run on the simulator: frameworks run on a real GPU only"


def mib(n: int) -> str:
    return f"{n / MiB:.0f} MiB"


# -- the rules --------------------------------------------------------------


def view_row(step: str, label: str, limit: int, view: dict) -> Row:
    return check(step, f"{label}: the slice's view", f"total {mib(limit)}",
                 f"total {mib(view['total'])}, free {mib(view['free'])}", view["total"] == limit)  # fmt: skip


def oom_row(step: str, label: str, limit: int, out: Outcome) -> Row:
    refusal, charge = out.result["refusal"], out.samples["full"].charge
    refused = not refusal.startswith("no OOM")
    return check(step, f"{label}: OOM at the limit", f"its OOM error, the slice charged within 64 MiB of {mib(limit)}",
                 f"{refusal} after {mib(out.result['allocated'])}; slice charged {mib(charge)}",
                 refused and limit - CHUNK < charge <= limit)  # fmt: skip


def given_back_row(step: str, label: str, out: Outcome, freed: str | None = "freed") -> Row:
    """Freed memory comes off the charge; all of it once the process is gone."""
    warm = out.samples["warm"].charge
    observed = f"warm {mib(warm)}"
    ok = out.exit_charge == 0 and 0 <= out.exit_reclaim_s <= RECLAIM_S
    if freed:
        after = out.samples[freed].charge
        observed += f", after freeing {mib(after)}"
        ok = ok and after <= warm + CHUNK
    observed += f", {mib(out.exit_charge)} {out.exit_reclaim_s:.2f} s after exit"
    return check(step, f"{label}: memory given back", f"freed comes off the charge; 0 within {RECLAIM_S:g} s of exit",
                 observed, ok)  # fmt: skip


ACCOUNTING_SLACK = 16 * MiB  # the driver's count may lead the slice's charge by this much after warm-up


def accounting_row(step: str, label: str, sample: Sample, reserve: int) -> Row:
    """The driver's own count for the process against the slice's charge: the
    charge includes what the driver allocates itself (the daemon reads its
    count every period: allocator/driver_memory.py), so it is not less."""
    expected = f"the driver's count ≤ the slice's charge + 16 MiB ({mib(reserve)} charged per context, the rest read)"
    if sample.nvml_used is None:
        return check(step, f"{label}: accounting", expected, "NVML gives no per-process figure here", None)
    gap = sample.nvml_used - sample.charge
    observed = f"driver {mib(sample.nvml_used)}, slice {mib(sample.charge)}, driver - slice {gap / MiB:+.0f} MiB"
    return check(step, f"{label}: accounting", expected, observed, gap <= ACCOUNTING_SLACK)


def memory_rows(step: str, label: str, limit: int, reserve: int, out: Outcome) -> list[Row]:
    return [
        view_row(step, label, limit, out.result["view"]),
        oom_row(step, label, limit, out),
        given_back_row(step, label, out),
        accounting_row(step, label, out.samples["warm"], reserve),
    ]


def jax_rows(step: str, label: str, limit: int, reserve: int, out: Outcome, prealloc: bool) -> list[Row]:
    """XLA's allocator takes a fraction of what the driver says the GPU has: here, of the slice."""
    view, warm, full = out.result["view"], out.samples["warm"], out.samples["full"]
    rows = [check(step, f"{label}: its limit is a fraction of the slice", f"0 < limit ≤ {mib(limit)}",
                  f"limit {mib(view['total'])}", 0 < view["total"] <= limit)]  # fmt: skip
    if prealloc:
        # XLA's pool is 75 % of the slice; the charge beside it is JAX's and the driver's own (cuBLAS
        # workspaces, module code), which the daemon charges too: the H100 showed 100 MiB of it
        pool = int(view.get("stats", {}).get("pool_bytes", 0))
        taken = warm.charge - reserve
        observed = f"pool {mib(pool)}; {mib(taken)} charged besides the context ({mib(taken - pool)} beside the pool)"
        rows.append(check(step, f"{label}: preallocates 75 % of the slice", f"XLA's pool {mib(int(0.75 * limit))} "
                          "± 64 MiB", observed, abs(pool - 0.75 * limit) <= CHUNK and pool <= taken))  # fmt: skip
    refused = not out.result["refusal"].startswith("no OOM")
    # preallocated, arrays come out of XLA's pool; growing, each region is charged as it is taken
    reach = view["free"] if prealloc else min(view["free"], limit - warm.charge)
    rows.append(check(step, f"{label}: OOM at its limit", f"its OOM error past {mib(reach)}, never past {mib(limit)}",
                      f"{out.result['refusal']} after {mib(out.result['allocated'])}; slice charged {mib(full.charge)}",
                      refused and full.charge <= limit and out.result["allocated"] >= reach - 2 * CHUNK))  # fmt: skip
    rows.append(given_back_row(step, label, out, freed=None))
    rows.append(accounting_row(step, label, warm, reserve))
    return rows


FIT_WAIT = 18.0  # s: how long the shares step waits for the daemon's fit before it measures all the same
IDLE_AT = 22.0  # s: when the elastic 30 % tenant stops launching (its share given back to the 70 %)


def given_back_rows(step: str, nvml: list[float], rates: list[float], alone: float) -> list[Row]:
    """The elastic 70 % tenant once the 30 % idles: judged by its throughput against its rate
    alone (NVML's figure also counts the gaps its own loop leaves: a fact)."""
    thr = [100 * r / alone for r in rates] if alone else [0.0]
    label = "elastic 70 % once the 30 % tenant idles"
    return [
        check(step, f"{label}: NVML", "a fact, from 2 s after",
              f"{statistics.fmean(nvml):.1f} % (1 s windows {min(nvml):.1f}-{max(nvml):.1f})", None),
        check(step, f"{label}: throughput", "≥ 90 % of its rate alone, from 2 s after",
              f"{statistics.fmean(thr):.1f} % (per second {min(thr):.1f}-{max(thr):.1f})",
              statistics.fmean(thr) >= 90),
    ]  # fmt: skip


def accounted_row(step: str, label: str, share: float | None, why: str | None) -> Row:
    """A tenant's GPU time over the judged seconds by NVML's accounting (kit_accounting): a fact."""
    observed = f"{share:.1f} %" if share is not None else (why or "no accounting stats for its process")
    return check(step, f"{label}: NVML accounting", "a fact: its GPU time by the driver's count", observed, None)


def share_rows(step: str, label: str, target: float, windows: list[float], rates: list[float], alone: float,
               points: float | None = None) -> list[Row]:  # fmt: skip
    """A tenant's share from NVML (per 1 s window and over them all), and from
    its own throughput against its rate alone, within `points` (SHARE_POINTS)."""
    points = SHARE_POINTS if points is None else points
    over = statistics.fmean(windows) if windows else 0.0
    spread = f"1 s windows {min(windows):.1f}-{max(windows):.1f}" if windows else "no windows"
    thr = [100 * r / alone for r in rates] if alone else []
    thr_all = statistics.fmean(thr) if thr else 0.0
    return [
        # a fact, not a check: a driver that gives each sample period to one process (the H100's,
        # driver 580) cannot tell time-sliced tenants apart by their samples (docs/compute.md)
        check(step, f"{label}: NVML", f"a fact: {target:g} % where each process is sampled on its own",
              f"{over:.1f} % over {len(windows)} s ({spread})", None),
        check(step, f"{label}: throughput", f"{target:g} ± {points:g} % of its rate alone",
              f"{thr_all:.1f} % ({len(thr)} s; per second {min(thr, default=0):.1f}-{max(thr, default=0):.1f})",
              abs(thr_all - target) <= points),
    ]  # fmt: skip


def cost_rows(step: str, gated: list[dict], direct: list[dict]) -> list[Row]:
    g_step, d_step = min(r["step_ms"] for r in gated), min(r["step_ms"] for r in direct)
    g_ns, d_ns = min(r["launch_ns"] for r in gated), min(r["launch_ns"] for r in direct)
    noise = max(r["launch_ns"] for r in direct) - d_ns
    return [
        check(step, "training step through the interposer", "≤ 1.03 x without",
              f"{g_step:.3f} ms against {d_step:.3f} ms: x{g_step / d_step:.3f} ({len(gated)} runs each, interleaved)",
              g_step <= 1.03 * d_step),
        check(step, "kernel launch through the interposer", "≤ 20 ns added (DESIGN's budget), beyond the noise",
              f"{g_ns:.0f} ns against {d_ns:.0f} ns: {g_ns - d_ns:+.0f} ns, x{g_ns / d_ns:.3f} (noise {noise:.0f} ns)",
              g_ns - d_ns <= 20 + noise),
    ]  # fmt: skip


# -- running them ----------------------------------------------------------


@dataclass
class Kit:
    client: AllocatorClient
    gpu: Gpu
    layout: Layout
    sim: bool
    reserve: int  # what the daemon charges per context: the measured context cost
    deadline: float  # monotonic: this call's end
    config: Path
    spec: Path
    gpuslice: Path
    out: Path
    slices: Path  # the daemon's slice files: a probe that overruns gets its gate's record
    daemon_log: Path  # a step that judges what the daemon said reads it

    def gate(self, box: Box) -> Gate:
        def record() -> dict:
            name = self.client.get(box.name).id
            if not (self.slices / f"{name}.usage").exists():
                return {"slice": name, "files": "gone"}
            return {"slice": name, **SliceFiles(self.slices, name).gate_record(0)}

        return record

    @property
    def limit(self) -> int:
        return (1 if self.sim else 4) * GiB

    def timeout(self, cap: float) -> float:
        return max(30.0, min(cap, self.deadline - time.monotonic() + 30))


def _why(e: BaseException) -> str:
    return (e.details() or "") if isinstance(e, grpc.RpcError) else f"{type(e).__name__}: {e}"


def _failed(step: str, label: str, expected: str, e: BaseException) -> tuple[list[Row], dict]:
    """A case that failed: its row, and what a probe that overran was doing (for the report)."""
    overrun = getattr(e, "overrun", "")
    observed = _why(e) + (" (its stacks and gate: the report's end)" if overrun else "")
    return [check(step, label, expected, observed, False)], ({"overruns": {label: overrun}} if overrun else {})


def _failed_step(step: str, label: str, expected: str, e: BaseException) -> StepResult:
    rows, facts = _failed(step, label, expected, e)
    return StepResult(step, rows, 0, facts)


def memory_case(kit: Kit, step: str, label: str, script: str, args: list[str], env: dict[str, str],
                judge: Callable[[Outcome], list[Row]] | None = None) -> tuple[list[Row], dict]:  # fmt: skip
    try:
        with slice_box(kit.client, kit.gpu, kit.layout, {request.MEMORY: str(kit.limit)}) as box:
            out = run_probe(kit.client, box, kit.gpu.uuid, script, [str(kit.limit), *args], {**box.env, **env},
                            kit.timeout(300), gate=kit.gate(box))  # fmt: skip
        rows = judge(out) if judge else memory_rows(step, label, kit.limit, kit.reserve, out)
        return rows, {"result": out.result, "charges": {t: s.charge for t, s in out.samples.items()},
                      "nvml": {t: s.nvml_used for t, s in out.samples.items()}}  # fmt: skip
    except FAILURES as e:
        rows, facts = _failed(step, label, "runs in a slice", e)
        return rows, facts


def selftest(kit: Kit) -> StepResult:
    argv = [str(kit.gpuslice), "selftest", "--config", str(kit.config), "--cdi-spec", str(kit.spec), "--json",
            "--seconds", "10", "--memory", str(GiB + -(-kit.reserve // CHUNK) * CHUNK)]  # fmt: skip
    if kit.sim:  # there the step checks the kit's machinery; the selftest's shares on the simulator
        argv.append("--no-shares")  # are tests/integration/test_selftest.py's (18 of the step's 23 s)
    r = subprocess.run(argv, capture_output=True, text=True, timeout=kit.timeout(420))
    (kit.out / "selftest.json").write_text(r.stdout)
    try:
        checks = json.loads(r.stdout)["checks"]
    except (ValueError, KeyError):
        return StepResult("selftest", [check("selftest", "gpuslice selftest", "its JSON report",
                                             (r.stderr or r.stdout).strip()[-300:], False)], 0)  # fmt: skip
    rows = [Row("selftest", c["name"], c["expected"], c["observed"], c["verdict"]) for c in checks]
    return StepResult("selftest", rows, 0, {"exit": r.returncode})


def driver_api(kit: Kit) -> StepResult:
    rows, facts = [], {}
    for path, label in (("mem", "cuMemAlloc"), ("vmm", "cuMemCreate (VMM)")):
        label = f"cuda.bindings {label}"
        got, facts[path] = memory_case(kit, "driver-api", label, "cuda_driver.py", [path], {})
        rows += got
    return StepResult("driver-api", rows, 0, facts)


def nvml_view(kit: Kit) -> StepResult:
    step, size = "nvml-view", 512 * MiB
    try:
        with slice_box(kit.client, kit.gpu, kit.layout, {request.MEMORY: str(kit.limit)}) as box:
            holder = Probe(box, "cuda_driver.py", ["hold", str(size)], box.env, kit.timeout(120), kit.gate(box))
            try:
                said = holder.message(time.monotonic() + holder.timeout)
                charge = kit.client.get(box.name).memory_used
                view = run_probe(
                    kit.client, box, kit.gpu.uuid, "nvml_view.py", [], box.env, kit.timeout(60), reclaim=False
                ).result
                os.kill(holder.pid, signal.SIGKILL)
                took, left = wait_released(kit.client, box.name)
            finally:
                holder.kill()
    except FAILURES as e:
        return _failed_step(step, "NVML inside a slice", "runs in a slice", e)
    pids = {holder.pid, said.get("pid")}
    observed = f"{mib(charge)} held; {mib(left)} left after {took:.2f} s"
    reclaim_row = check(step, "SIGKILL gives the holder's memory back", f"0 within {RECLAIM_S:g} s", observed,
                        left == 0 and took <= RECLAIM_S)  # fmt: skip
    facts = {"view": view, "charge": charge, "holder_pids": sorted(p for p in pids if p)}
    return StepResult(step, [*view_rows(step, kit.limit, charge, pids, view), reclaim_row], 0, facts)


def view_rows(step: str, limit: int, charge: int, pids: set, view: dict) -> list[Row]:
    nv = view["nvml"]
    listed = [p["pid"] for p in nv["processes"]]
    rows = [
        check(step, "NVML inside the slice: memory", f"total {mib(limit)}, used {mib(charge)} (the slice's charge)",
              f"total {mib(nv['total'])}, used {mib(nv['used'])}", nv["total"] == limit and nv["used"] == charge),
        check(step, "NVML inside the slice: processes", "the slice's one process",
              f"{listed} (the holder: {sorted(p for p in pids if p)})", len(listed) == 1 and listed[0] in pids),
    ]  # fmt: skip
    smi = view.get("nvidia_smi")
    if smi is None:
        rows.append(skipped(step, "nvidia-smi inside the slice", "no nvidia-smi on this machine"))
    else:
        rows += smi_rows(step, limit, charge, pids, smi, nv.get("driver", ""))
    return rows


def smi_rows(step: str, limit: int, charge: int, pids: set, smi: dict, driver: str) -> list[Row]:
    """nvidia-smi in the slice: every form exits 0, shows the slice's memory and process and the
    driver's version; the NVML names it could miss are a fact of their own."""
    runs = smi["runs"]
    failed = {f: f"exit {r['rc']}: {(r['err'] or r['out']).strip()[-200:]}" for f, r in runs.items() if r["rc"]}
    apps = [p["pid"] for p in smi.get("processes", [])]
    rows = [
        check(step, "nvidia-smi inside the slice: runs", f"exit 0 for {', '.join(runs)}",
              "; ".join(f"{f}: {w}" for f, w in failed.items()) or "all exit 0", not failed),
        check(step, "nvidia-smi inside the slice: memory",
              f"{limit // MiB} MiB total (both forms), {charge // MiB} MiB used",
              f"{smi.get('total_mib')} MiB total, -q {smi.get('q_total_mib')} MiB, {smi.get('used_mib')} MiB used",
              smi.get("total_mib") == smi.get("q_total_mib") == limit // MiB
              and abs(smi.get("used_mib", -9) - charge // MiB) <= 1),
        check(step, "nvidia-smi inside the slice: processes", "the slice's one process", f"{apps}",
              len(apps) == 1 and apps[0] in pids),
        check(step, "nvidia-smi inside the slice: versions", f"the driver's ({driver})", f"{smi.get('driver')}",
              bool(driver) and smi.get("driver") == driver),
    ]  # fmt: skip
    missing = smi.get("missing_exports")
    rows.append(check(step, "the driver's NVML names the slice's NVML lacks", "none (a fact)",
                      ", ".join(missing) if isinstance(missing, list) else str(missing), None))  # fmt: skip
    return rows


def pytorch(kit: Kit) -> StepResult:
    rows, facts = [], {}
    for segments, label in (("False", "PyTorch caching allocator"), ("True", "PyTorch expandable_segments (VMM)")):
        env = {"PYTORCH_CUDA_ALLOC_CONF": f"expandable_segments:{segments}"}
        got, facts[label] = memory_case(kit, "pytorch", label, "torch_memory.py", [], env)
        rows += got
    return StepResult("pytorch", rows, 0, facts)


def cupy(kit: Kit) -> StepResult:
    rows, facts = [], {}
    for pool, label in (("default", "CuPy default pool"), ("async", "CuPy MemoryAsyncPool")):
        got, facts[pool] = memory_case(kit, "cupy", label, "cupy_memory.py", [pool], {})
        rows += got
    label = "CuPy kernel from PTX (the driver's JIT, as the CDI spec mounts it)"
    got, facts["ptx"] = memory_case(kit, "cupy", label, "cupy_ptx.py", [], {}, judge=lambda out: [
        check("cupy", label, "compiles in the slice's view of the driver and adds right",
              f"right: {out.result['right']} over {out.result['n']} floats", out.result["right"])])  # fmt: skip
    rows += got
    return StepResult("cupy", rows, 0, facts)


def jax(kit: Kit) -> StepResult:
    rows, facts = [], {}
    for prealloc, label in ((False, "JAX, XLA_PYTHON_CLIENT_PREALLOCATE=false"), (True, "JAX, default preallocation")):
        env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "true" if prealloc else "false"}
        got, facts[label] = memory_case(
            kit, "jax", label, "jax_memory.py", [], env,
            judge=lambda out, p=prealloc, lb=label: jax_rows("jax", lb, kit.limit, kit.reserve, out, p))  # fmt: skip
        rows += got
    return StepResult("jax", rows, 0, facts)


def nccl(kit: Kit) -> StepResult:
    step, label = "nccl", "NCCL all-reduce (one rank, NCCL_CUMEM_ENABLE=1)"

    def judge(out: Outcome) -> list[Row]:
        warm = out.samples["warm"]
        return [
            check(step, f"{label}: result", "the sum right, no crash", f"right: {out.result['all_reduce_right']}, "
                  f"NCCL {out.result['nccl']}", out.result["all_reduce_right"]),
            check(step, f"{label}: charged", "the tensor and NCCL's buffers charged while up",
                  f"{mib(warm.charge)} charged", warm.charge >= kit.reserve + 64 * MiB),
            given_back_row(step, label, out),
            accounting_row(step, label, warm, kit.reserve),
        ]  # fmt: skip

    rows, facts = memory_case(kit, step, label, "nccl_allreduce.py", [], {"NCCL_CUMEM_ENABLE": "1"}, judge)
    return StepResult(step, rows, 0, facts)


def transformers(kit: Kit) -> StepResult:
    step, label, new = "transformers", "Llama, random weights, generate", 64

    def judge(out: Outcome) -> list[Row]:
        r, warm = out.result, out.samples["warm"]
        return [
            check(step, f"{label}: tokens", f"{new} new tokens x 4 in a {mib(kit.limit)} slice",
                  f"{r['new_tokens']} x {r['batch']} in {r['seconds']:.2f} s ({r['parameters'] / 1e6:.0f} M "
                  f"parameters, peak {mib(r['peak_allocated'])}; slice {mib(warm.charge)})", r["new_tokens"] == new),
            given_back_row(step, label, out, freed=None),
            accounting_row(step, label, warm, kit.reserve),
        ]  # fmt: skip

    def run(interposed: bool) -> dict:  # the same generate in a box of its own, through gpuslice or not
        with slice_box(kit.client, kit.gpu, kit.layout, {request.MEMORY: str(kit.limit)}) as box:
            argv, env = [str(kit.limit), str(new)], box.env if interposed else without_interposer(box.env)
            return run_probe(kit.client, box, kit.gpu.uuid, "transformers_generate.py", argv, env, kit.timeout(300),
                             reclaim=interposed).result  # fmt: skip

    # a machine's first generate reads the libraries and kernels from disk: whichever runs first pays
    # it (an H200's first kit call: x1.40 with the slice's run first, x1.07 in a later call), so
    # one run without gpuslice, not compared, goes before those that are
    try:
        first: float | str = run(False)["seconds"]
    except FAILURES as e:  # the compared ones still run, and say what fails
        first = _why(e)
    rows, facts = memory_case(kit, step, label, "transformers_generate.py", [str(new)], {}, judge)
    # then each side in turn, the fastest of each compared: the same generate without gpuslice took
    # 3.57 s in one call and 4.30 s in the next on the H200, so one run a side decides nothing
    in_slice = [t for t in [facts.get("result", {}).get("seconds")] if t is not None]
    direct: list[float] = []
    try:
        result = run(False)
        direct.append(result["seconds"])
        in_slice.append(run(True)["seconds"])
        direct.append(run(False)["seconds"])
    except FAILURES as e:
        failed, more = _failed(step, f"{label}: without gpuslice", "runs", e)
        return StepResult(step, rows + failed, 0, {**facts, **more})
    facts["direct_seconds"], facts["in_slice_seconds"], facts["direct"] = direct, in_slice, result
    facts["first_seconds"] = first
    rows.append(check(step, f"{label}: the machine's first", "a fact: without gpuslice, before those compared",
                      f"{first:.2f} s" if isinstance(first, float) else str(first), None))  # fmt: skip
    rows.append(generate_time_row(step, label, in_slice, direct))
    rows.append(generate_paths_row(step, label, facts.get("result", {}), result))
    return StepResult(step, rows, 0, facts)


def generate_time_row(step: str, label: str, in_slice: list[float], direct: list[float]) -> Row:
    """The fastest generate in a slice against the fastest without gpuslice, each run listed."""
    runs = f" (runs {', '.join(f'{t:.2f}' for t in in_slice)} against {', '.join(f'{t:.2f}' for t in direct)})"
    best = min(direct)
    observed = (f"{min(in_slice):.2f} s in the slice, {best:.2f} s without: x{min(in_slice) / best:.2f}{runs}"
                if in_slice else f"no time in the slice; {best:.2f} s without")  # fmt: skip
    return check(step, f"{label}: time", "≤ 1.1 x its time without gpuslice (the fastest of each)", observed,
                 bool(in_slice) and min(in_slice) <= 1.1 * best)  # fmt: skip


def generate_paths_row(step: str, label: str, in_slice: dict, direct: dict) -> Row:
    """Where a slower generate's time goes: a second (warm) generate, a tiny op's launch,
    a launch with a copy back, a fresh cudaMalloc, and what the first run asked of the
    driver (PyTorch's cudaMallocs, and retries after an OOM: a cache flushed at the
    slice's limit is paid once), in the slice and without gpuslice (a fact)."""
    keys = (("again_seconds", "warm generate", " s", 2), ("launch_us", "launch", " us", 1),
            ("launch_and_copy_us", "launch + copy back", " us", 1), ("malloc_us", "fresh cudaMalloc", " us", 1),
            ("num_device_alloc", "the first run's cudaMallocs", "", 0),
            ("num_alloc_retries", "its retries after an OOM", "", 0))  # fmt: skip
    parts = [f"{name} {in_slice[k]:.{d}f}{u} against {direct[k]:.{d}f}{u}" for k, name, u, d in keys
             if k in in_slice and k in direct]  # fmt: skip
    return check(step, f"{label}: where the time goes", "a fact: in the slice against without gpuslice",
                 "; ".join(parts) or "not measured", None)  # fmt: skip


def _hard(cores: int) -> dict[str, str]:
    return {request.MEMORY: str(4 * GiB), request.CORES: str(cores), request.POLICY: "hard"}


def cuda_graph(kit: Kit) -> StepResult:
    step, share, seconds = "cuda-graph", 50, 8.0
    try:
        with slice_box(kit.client, kit.gpu, kit.layout, _hard(share)) as box:
            probe = Probe(box, "cuda_graph.py", [str(seconds)], box.env, kit.timeout(180), kit.gate(box))
            try:
                probe.message(time.monotonic() + probe.timeout)
                probe.answer()
                time.sleep(2)  # the gate's budget settles
                (use,) = sm_use(kit.gpu.uuid, [probe.pid], seconds - 3)
                result = probe.message(time.monotonic() + 60)["result"]
            finally:
                probe.kill()
    except FAILURES as e:
        return _failed_step(step, "CUDA graph under a hard share", "runs in a slice", e)
    return StepResult(step, [
        check(step, "CUDA graph replay", "the same as the eager run", f"same: {result['same_as_eager']}, "
              f"{result['replays'] / result['seconds']:.0f} replays/s", result["same_as_eager"]),
        check(step, f"CUDA graph under hard {share} %", f"{share} ± {SHARE_POINTS:g} % (NVML)", f"{use:.1f} %",
              abs(use - share) <= SHARE_POINTS),
    ], 0, {"result": result, "sm_use": use})  # fmt: skip


def _tenants(kit: Kit, boxes: list, seconds: float, idle_after: list[float],
             envs: list[dict[str, str]] | None = None,
             more: list[list[str]] | None = None) -> tuple[list[Probe], list[int]]:  # fmt: skip
    """Matmul tenants, one a box (its environment, or `envs`; `more` arguments
    each, matmul_loop.py's), all ready, then all let go."""
    probes: list[Probe] = []
    try:
        for b, i, env, extra in zip(boxes, idle_after, envs or [b.env for b in boxes], more or [[] for _ in boxes],
                                    strict=True):  # fmt: skip
            probes.append(Probe(b, "matmul_loop.py", [str(seconds), str(i), *extra], env, kit.timeout(180),
                                kit.gate(b)))  # fmt: skip
        for p in probes:
            p.message(time.monotonic() + p.timeout)
        for p in probes:
            p.answer()
    except BaseException:  # one that fails to start or to get ready leaves none of them running
        for p in probes:
            p.kill()
        raise
    return probes, [p.pid for p in probes]


def _windows(gpu_uuid: str, pids: list[int], first: int, last: int, started: float) -> list[list[float]]:
    """Each process's SM use per 1 s window, from second `first` to `last` after `started`."""
    time.sleep(max(0.0, started + first - time.monotonic()))
    return [sm_use(gpu_uuid, pids, 1.0) for _ in range(last - first)]


@dataclass
class Pair:
    """Matmul tenants in slices of `targets` % (made in that order), as measured."""

    fit_s: float | None
    span: slice  # the seconds judged, after the fit
    busy: list[list[float]]  # each tenant's NVML use per 1 s window of the span
    per_second: list[list[int]]  # each tenant's products per second, from its start
    given: slice | None = None  # the seconds judged once the first tenant idles
    after: list[list[float]] = field(default_factory=list)
    accounted: list[float | None] = field(default_factory=list)  # each one's % over the span, NVML accounting
    accounting: str | None = None  # why it has none
    clocks: list[dict] = field(default_factory=list)  # kit_clocks' readings from the tenants' start

    def facts(self) -> dict:
        return {"busy": self.busy, "after_idle": self.after, "per_second": self.per_second, "fitted_s": self.fit_s,
                "accounted": self.accounted, "accounting": self.accounting, "clocks": self.clocks}  # fmt: skip

    def clocks_seen(self) -> str:
        """The clocks while the costs were fitted (the GPU part-busy) and over the judged seconds."""
        fit_end = self.fit_s if self.fit_s is not None else float(self.span.start)
        return (f"fit: {kit_clocks.describe(self.clocks, 0.0, fit_end)}; judged: "
                f"{kit_clocks.describe(self.clocks, self.span.start, self.span.stop)}")  # fmt: skip


def _after_fit(kit: Kit, boxes: list, started: float) -> tuple[float | None, int]:
    """The daemon first fits the slices' costs where the driver gives each period to one
    process (docs/compute.md): (seconds from `started` to its end, None if not within
    FIT_WAIT; the first second judged, one after it)."""
    settled = kit.client.compute_settled([b.name for b in boxes], FIT_WAIT)
    fit_s = (settled / 1e9 - started) if settled is not None else None
    return fit_s, max(3, math.ceil((fit_s if fit_s is not None else FIT_WAIT) + 1))


def _pair(kit: Kit, targets: tuple[int, ...], policy: str, idle_first: bool = False) -> Pair:
    # an H200 fitted two matmul tenants' costs in 4 to 15 s: the windows start a second after the
    # fit, and an elastic first tenant idles once the windows are done
    seconds = 36.0 if idle_first else FIT_WAIT + 23.0
    idle = [IDLE_AT if idle_first and i == 0 else 0.0 for i in range(len(targets))]
    with contextlib.ExitStack() as stack:
        unaccounted = stack.enter_context(kit_accounting.accounting(kit.gpu.uuid))  # before the tenants start
        boxes = [stack.enter_context(slice_box(kit.client, kit.gpu, kit.layout, {**_hard(t), request.POLICY: policy}))
                 for t in targets]  # fmt: skip
        probes, pids = _tenants(kit, boxes, seconds, idle)
        started = time.monotonic()
        clocks = stack.enter_context(kit_clocks.sampling(kit.gpu.uuid, started))
        try:
            fit_s, first = _after_fit(kit, boxes, started)
            span = slice(first, int(IDLE_AT) - 1 if idle_first else first + 20)
            time.sleep(max(0.0, started + span.start - time.monotonic()))
            before, at = kit_accounting.gpu_ms(kit.gpu.uuid, pids), time.monotonic()
            busy = _windows(kit.gpu.uuid, pids, span.start, span.stop, started)
            accounted = kit_accounting.shares(before, kit_accounting.gpu_ms(kit.gpu.uuid, pids), time.monotonic() - at)
            given = slice(int(IDLE_AT) + 2, int(IDLE_AT) + 12) if idle_first else None
            after = _windows(kit.gpu.uuid, pids, given.start, given.stop, started) if given else []
            results = [p.message(time.monotonic() + 60)["result"]["per_second"] for p in probes]
        finally:
            for p in probes:
                p.kill()
    return Pair(fit_s, span, busy, results, given, after, accounted, unaccounted, clocks.samples)


@dataclass
class Alone:
    """A matmul tenant alone on the GPU: its products per second, how busy NVML saw the GPU
    meanwhile, and kit_clocks' readings from its start."""

    rate: float
    busy: float
    clocks: list[dict]

    def facts(self) -> dict:
        return {"alone_per_s": self.rate, "alone_busy": self.busy, "alone_clocks": self.clocks}


def _alone(kit: Kit) -> Alone:
    """A matmul tenant alone, in a memory-only slice (its loop's synchronizations leave gaps:
    with how busy the GPU was, what a pair did per busy second tells a tenant slowed while
    time-sliced from a split that is off)."""
    with slice_box(kit.client, kit.gpu, kit.layout, {request.MEMORY: str(4 * GiB)}) as box:
        probes, pids = _tenants(kit, [box], 6.0, [0.0])
        started = time.monotonic()
        try:
            with kit_clocks.sampling(kit.gpu.uuid, started) as clocks:
                busy = _windows(kit.gpu.uuid, pids, 1, 5, started)
            per_second = probes[0].message(time.monotonic() + 60)["result"]["per_second"]
        finally:
            probes[0].kill()
    return Alone(statistics.fmean(per_second[1:-1]), statistics.fmean(w[0] for w in busy), clocks.samples)


UNGATED_S = 8.0  # each ungated tenant's run: seconds 2 to 6 of it are judged


@dataclass
class Ungated:
    """Two matmul tenants time-slicing on the driver alone (no interposer, so no gate): what
    time slicing itself costs two equal tenants, without gpuslice's controller in the way."""

    per_second: list[list[int]]  # each one's products per second over the judged seconds
    accounted: list[float | None]  # each one's % of the GPU over them, NVML accounting
    accounting: str | None  # why it has none
    clocks: list[dict]

    def facts(self) -> dict:
        return {"ungated_per_s": self.per_second, "ungated_accounted": self.accounted,
                "ungated_accounting": self.accounting, "ungated_clocks": self.clocks}  # fmt: skip

    def observed(self, alone: float) -> str:
        rates = [100 * statistics.fmean(r) / alone if r and alone else 0.0 for r in self.per_second]
        acct = " / ".join(f"{a:.1f}" if a is not None else "-" for a in self.accounted)
        why = f" ({self.accounting})" if self.accounting else ""
        return (f"{' + '.join(f'{r:.1f}' for r in rates)} = {sum(rates):.1f} % of one alone; NVML accounting "
                f"{acct} %{why}; {kit_clocks.describe(self.clocks, 2.0, UNGATED_S - 2)}")  # fmt: skip


def _ungated(kit: Kit) -> Ungated:
    """Two matmul tenants in memory-only slices, run without the interposer: the driver's time
    slicing alone. On the H200 the 30 % tenant of hard 30 / 70 did 26.3-28.0 % of its rate alone
    and the 70 % one 69.4-69.7 %: whether time slicing two equal tenants loses that much of the
    GPU too (their rates adding up to under 100 %) or none (then the loss is the gate's)."""
    judged = slice(2, int(UNGATED_S) - 2)
    with contextlib.ExitStack() as stack:
        why = stack.enter_context(kit_accounting.accounting(kit.gpu.uuid))  # before the tenants start
        boxes = [stack.enter_context(slice_box(kit.client, kit.gpu, kit.layout, {request.MEMORY: str(4 * GiB)}))
                 for _ in range(2)]  # fmt: skip
        probes, pids = _tenants(kit, boxes, UNGATED_S, [0.0, 0.0], [without_interposer(b.env) for b in boxes])
        started = time.monotonic()
        clocks = stack.enter_context(kit_clocks.sampling(kit.gpu.uuid, started))
        try:
            time.sleep(max(0.0, started + judged.start - time.monotonic()))
            before, at = kit_accounting.gpu_ms(kit.gpu.uuid, pids), time.monotonic()
            time.sleep(max(0.0, started + judged.stop - time.monotonic()))
            accounted = kit_accounting.shares(before, kit_accounting.gpu_ms(kit.gpu.uuid, pids), time.monotonic() - at)
            per_second = [p.message(time.monotonic() + 60)["result"]["per_second"][judged] for p in probes]
        finally:
            for p in probes:
                p.kill()
    return Ungated(per_second, accounted, why, clocks.samples)


def _ungated_row(step: str, ungated: Ungated, alone: float) -> Row:
    return check(step, "two matmul tenants, ungated", "a fact: each one's rate against one alone, and together; "
                 "each one's GPU time by NVML accounting", ungated.observed(alone), None)  # fmt: skip


def _alone_row(step: str, alone: Alone) -> Row:
    return check(step, "a matmul tenant alone", "a fact: its rate, the GPU's use by NVML, its clocks",
                 f"{alone.rate:.1f} products/s; NVML {alone.busy:.1f} %; "
                 f"{kit_clocks.describe(alone.clocks, 1.0, 5.0)}", None)  # fmt: skip


def _clocks_row(step: str, label: str, pair: Pair) -> Row:
    # a full GPU's matmuls read 8.8-11.4 % above their costs fitted at 40-80 % busy on the H200 (kit_clocks)
    return check(step, f"{label}: the GPU's clocks", "a fact: SM clock, power and what held them, "
                 "while fitting and judged", pair.clocks_seen(), None)  # fmt: skip


def _fit_row(step: str, label: str, fit_s: float | None) -> Row:
    fitted = f"{fit_s:.1f} s" if fit_s is not None else f"not within {FIT_WAIT:g} s"
    return check(step, f"{label}: the daemon's fit of their costs", "a fact: from the start", fitted, None)


def shares(kit: Kit) -> StepResult:
    step, facts, rows = "shares", {}, []
    try:
        measured = _alone(kit)
        facts.update(measured.facts())
        alone = measured.rate
        rows.append(_alone_row(step, measured))
        ungated = _ungated(kit)
        facts.update(ungated.facts())
        rows.append(_ungated_row(step, ungated, alone))
        for policy in ("hard", "elastic"):
            pair = _pair(kit, (30, 70), policy, idle_first=policy == "elastic")
            facts[policy] = pair.facts()
            rows.append(_fit_row(step, f"{policy} 30/70", pair.fit_s))
            rows.append(_clocks_row(step, f"{policy} 30/70", pair))
            for i, target in enumerate((30, 70)):
                rows += share_rows(step, f"{policy} {target} %", target, [w[i] for w in pair.busy],
                                   pair.per_second[i][pair.span], alone)  # fmt: skip
                rows.append(accounted_row(step, f"{policy} {target} %", pair.accounted[i], pair.accounting))
            if pair.given:
                rows += given_back_rows(step, [w[1] for w in pair.after], pair.per_second[1][pair.given], alone)
    except FAILURES as e:
        failed, more = _failed(step, "two tenants' shares", "run in slices", e)
        rows += failed
        facts.update(more)
    return StepResult(step, rows, 0, facts)


def share_bias(kit: Kit) -> StepResult:
    """Whose work falls short while two tenants time-slice. On an H200 the 30 % tenant of hard
    30 / 70 did 26.3-28.0 % of its rate alone and the 70 % one 69.4-69.7 %, its cost fitted
    10-17 % above the other's for the same kernels; the 30 % slice was the first made each
    time. The same pair made 70 first, and two equal 50 % tenants, tell share from order; four
    tenants at 10/20/30/40 are held to 2 points (issue 46)."""
    step, facts, rows = "share-bias", {}, []
    try:
        measured = _alone(kit)
        facts.update(measured.facts())
        alone = measured.rate
        rows.append(_alone_row(step, measured))
        for targets in ((70, 30), (50, 50), (10, 20, 30, 40)):
            label = f"hard {'/'.join(map(str, targets))}, in that order"
            pair = _pair(kit, targets, "hard")
            facts[label] = pair.facts()
            rows.append(_fit_row(step, label, pair.fit_s))
            rows.append(_clocks_row(step, label, pair))
            points = FOUR_POINTS if len(targets) > 2 else None
            for i, target in enumerate(targets):
                rows += share_rows(step, f"{label}: #{i + 1}, {target} %", target, [w[i] for w in pair.busy],
                                   pair.per_second[i][pair.span], alone, points)  # fmt: skip
                rows.append(accounted_row(step, f"{label}: #{i + 1}", pair.accounted[i], pair.accounting))
    except FAILURES as e:
        failed, more = _failed(step, "two tenants' shares, order and equal", "run in slices", e)
        rows += failed
        facts.update(more)
    return StepResult(step, rows, 0, facts)


LEND = (50, 30)  # a hard 50 % lender beside an elastic 30 % borrower, as the simulator's lending test
LEND_LIGHT = 10.0  # % of its rate alone: the lender's load until it rises
RISE_AT = FIT_WAIT + 8.0  # s: when the lender saturates; the light seconds are after the fit, before this
LEND_AFTER = 10.0  # s: how long both then saturate
GIVE_BACK_S = 2.0  # the lender has its share back within this, as on the simulator
BORROWS = 75.0  # % of its rate alone the borrower does at least while the lender is light (the simulator's test)
REFINE = ("measuring it again", "cost measured again", "to measure its cost again")  # cost_split's lines


@dataclass
class Lending:
    """The lender and the borrower, as measured: light, then both saturating."""

    fit_s: float | None
    light: slice  # the seconds judged while the lender is light (after the fit)
    after: slice  # the seconds judged once both saturate (from GIVE_BACK_S + 1 after the rise)
    busy_light: list[list[float]]  # each one's NVML use per 1 s window of `light`
    busy_after: list[list[float]]  # ... of `after`
    per_second: list[list[int]]  # each one's products per second, from its start
    refine: list[str]  # the daemon's lines about measuring the lender's cost again

    def facts(self) -> dict:
        return {"fitted_s": self.fit_s, "busy_light": self.busy_light, "busy_after": self.busy_after,
                "per_second": self.per_second, "refine": self.refine}  # fmt: skip


def given_back_s(rates: list[int], rise: int, target: float, alone: float, points: float = SHARE_POINTS) -> int | None:
    """Seconds from the rise to the end of the first second from which every full
    second's throughput is within `points` of `target` % of its rate alone (1: the
    second of the rise already is); None: never."""
    thr = [100 * r / alone for r in rates[rise:-1]]  # the last second is cut short by the loop's end
    for i in range(len(thr)):
        if all(abs(t - target) <= points for t in thr[i:]):
            return i + 1
    return None


def lend_rows(step: str, r: Lending, alone: float) -> list[Row]:
    (lender, lend_to), rise = LEND, int(RISE_AT)
    thr_light = [statistics.fmean(100 * x / alone for x in p[r.light]) if alone else 0.0 for p in r.per_second]
    back = given_back_s(r.per_second[0], rise, lender, alone)
    back_ok = back is not None and back <= GIVE_BACK_S
    label = f"hard {lender} % at a {LEND_LIGHT:g} % load beside elastic {lend_to} %"
    rows = [
        _fit_row(step, label, r.fit_s),
        check(step, f"{label}: the light one's throughput", f"{LEND_LIGHT:g} ± {SHARE_POINTS:g} % of its rate alone",
              f"{thr_light[0]:.1f} % ({r.light.stop - r.light.start} s)",
              abs(thr_light[0] - LEND_LIGHT) <= SHARE_POINTS),
        check(step, f"{label}: the borrower's throughput", f"≥ {BORROWS:g} % of its rate alone",
              f"{thr_light[1]:.1f} %; NVML {statistics.fmean(w[1] for w in r.busy_light):.1f} %"
              if r.busy_light else f"{thr_light[1]:.1f} %", thr_light[1] >= BORROWS),
        check(step, f"hard {lender} % once it saturates: its share back", f"within {GIVE_BACK_S:g} s, "
              f"{lender} ± {SHARE_POINTS:g} % by throughput from then on",
              f"within {back} s" if back is not None else "not within the run", back_ok),
        check(step, f"hard {lender} % once it saturates: its cost measured again", "a fact: the daemon's lines",
              " | ".join(r.refine) if r.refine else "no line: its cost was not measured again", None),
    ]  # fmt: skip
    for i, target in enumerate((lender, 100 - lender)):
        rows += share_rows(step, f"{'hard' if i == 0 else 'elastic'} {LEND[i]} % once both saturate", target,
                           [w[i] for w in r.busy_after], r.per_second[i][r.after], alone)  # fmt: skip
    return rows


def _lending(kit: Kit, alone: float) -> Lending:
    seconds = RISE_AT + LEND_AFTER
    said = LogLines(kit.daemon_log, at_end=True)
    with contextlib.ExitStack() as stack:
        boxes = [stack.enter_context(slice_box(kit.client, kit.gpu, kit.layout, {**_hard(t), request.POLICY: policy}))
                 for t, policy in zip(LEND, ("hard", "elastic"), strict=True)]  # fmt: skip
        light = [str(alone * LEND_LIGHT / 100), str(RISE_AT)]
        probes, pids = _tenants(kit, boxes, seconds, [0.0, 0.0], more=[light, []])
        started = time.monotonic()
        try:
            fit_s, first = _after_fit(kit, boxes, started)
            judged = slice(first, int(RISE_AT)), slice(int(RISE_AT + GIVE_BACK_S) + 1, int(seconds) - 1)
            busy_light = _windows(kit.gpu.uuid, pids, judged[0].start, judged[0].stop, started)
            busy_after = _windows(kit.gpu.uuid, pids, judged[1].start, judged[1].stop, started)
            results = [p.message(time.monotonic() + 60)["result"]["per_second"] for p in probes]
        finally:
            for p in probes:
                p.kill()
    refine = said.new(*REFINE)
    return Lending(fit_s, judged[0], judged[1], busy_light, busy_after, results, refine)


def lend(kit: Kit) -> StepResult:
    """A light slice lends what it leaves and has its share back once it saturates: its cost,
    fitted at its light use, is measured again at its share (docs/compute.md; on the simulator
    light 49.3-50.1 %, given back in 1.0-1.6 s). Not yet measured on a real driver."""
    step, facts, rows = "lend", {}, []
    try:
        measured = _alone(kit)
        facts.update(measured.facts())
        alone = measured.rate
        rows.append(_alone_row(step, measured))
        lending = _lending(kit, alone)
        facts.update(lending.facts())
        rows += lend_rows(step, lending, alone)
    except FAILURES as e:
        failed, more = _failed(step, "a light slice's lending", "runs in slices", e)
        rows += failed
        facts.update(more)
    return StepResult(step, rows, 0, facts)


def cost(kit: Kit) -> StepResult:
    step, gated, direct = "cost", [], []
    try:
        with slice_box(kit.client, kit.gpu, kit.layout, {request.MEMORY: str(4 * GiB)}) as box:
            # each side first in turn: on an H200 the side that always ran first was x1.084 in one call
            # and x0.989 in the next, its launches +115 and +404 ns: what runs first is not to decide
            for i in range(4):
                for side in ("gated", "direct") if i % 2 == 0 else ("direct", "gated"):
                    env, reclaim = (box.env, True) if side == "gated" else (without_interposer(box.env), False)
                    out = run_probe(kit.client, box, kit.gpu.uuid, "cost.py", [], env, kit.timeout(120),
                                    reclaim=reclaim).result  # fmt: skip
                    (gated if side == "gated" else direct).append(out)
    except FAILURES as e:
        return _failed_step(step, "cost", "runs in a slice", e)
    return StepResult(step, cost_rows(step, gated, direct), 0, {"gated": gated, "direct": direct})


MPS_SECONDS = 12.0  # each MPS tenant's run; seconds 2 to 10 of it are judged
MPS_PAIR = (30, 70)


def mps_client_row(step: str, label: str, clients: int, tenants: int) -> Row:
    return check(step, f"{label}: MPS clients", f"the control daemon serves all {tenants} (it lists them)",
                 f"{clients} listed", clients == tenants)  # fmt: skip


def mps_alone_row(step: str, rate: float, without: float) -> Row:
    ratio = f"{100 * rate / without:.1f} % of its rate without MPS" if without else "no rate without MPS"
    return check(step, "a matmul tenant alone under MPS", "a fact: its rate, against its rate without MPS",
                 f"{rate:.1f} products/s, {ratio}", None)  # fmt: skip


def mps_sum_row(step: str, label: str, rates: list[list[int]], alone: float) -> Row:
    total = sum(statistics.fmean(r) for r in rates) / alone * 100 if alone else 0.0
    return check(step, f"{label}: together", "a fact: both tenants' work against one alone under MPS",
                 f"{total:.1f} %", None)  # fmt: skip


MpsRun = tuple[list[list[int]], list[list[float]], int]  # products per second, NVML windows, clients listed


def _mps_run(kit: Kit, mps: kit_mps.Mps, threads: tuple[int | None, ...]) -> MpsRun:
    """Matmul tenants in memory-only slices, clients of the kit's MPS daemon at `threads`
    percent of the GPU's threads (None: no limit): each one's products per second, NVML's
    use per process per 1 s window of the judged seconds, and how many clients the daemon listed."""
    with contextlib.ExitStack() as stack:
        boxes = [stack.enter_context(slice_box(kit.client, kit.gpu, kit.layout, {request.MEMORY: str(4 * GiB)}))
                 for _ in threads]  # fmt: skip
        envs = [mps.client_env(b.env, t) for b, t in zip(boxes, threads, strict=True)]
        probes, pids = _tenants(kit, boxes, MPS_SECONDS, [0.0] * len(threads), envs)
        try:
            started = time.monotonic()
            clients = len(mps.clients())
            busy = _windows(kit.gpu.uuid, pids, 2, int(MPS_SECONDS) - 2, started)
            rates = [p.message(time.monotonic() + 60)["result"]["per_second"][2 : int(MPS_SECONDS) - 2]
                     for p in probes]  # fmt: skip
        finally:
            for p in probes:
                p.kill()
    return rates, busy, clients


def mps(kit: Kit) -> StepResult:
    """MPS-backed hard shares, measured before gpuslice offers them (issue 46, optional): a
    tenant alone under MPS against one without, then two at 30 and 70 % of the GPU's
    threads (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), by their own throughput (kit_mps.py)."""
    step, facts, rows = "mps", {}, []
    control = kit_mps.control_binary()
    if control is None:
        return StepResult(step, [skipped(step, "MPS", f"{kit_mps.CONTROL} is not on this machine's PATH")], 0)
    try:
        without = _alone(kit).rate
        facts["without_mps_per_s"] = without
        with kit_mps.running(control, kit.gpu.uuid) as daemon:
            try:
                (alone_rates,), _, clients = _mps_run(kit, daemon, (None,))
                alone = statistics.fmean(alone_rates)
                facts.update(alone_per_s=alone, alone_clients=clients)
                rows += [mps_client_row(step, "alone", clients, 1), mps_alone_row(step, alone, without)]
                label = f"threads {'/'.join(map(str, MPS_PAIR))} %"
                rates, busy, clients = _mps_run(kit, daemon, MPS_PAIR)
                facts[label] = {"per_second": rates, "busy": busy, "clients": clients}
                rows.append(mps_client_row(step, label, clients, len(MPS_PAIR)))
                for i, target in enumerate(MPS_PAIR):
                    rows += share_rows(step, f"{label}: {target} %", target, [w[i] for w in busy], rates[i], alone)
                rows.append(mps_sum_row(step, label, rates, alone))
            finally:
                facts["control_log"] = daemon.log_tail()
    except (*FAILURES, kit_mps.MpsError) as e:
        failed, more = _failed(step, "MPS tenants", "run as clients of an MPS daemon", e)
        rows += failed
        facts.update(more)
    return StepResult(step, rows, 0, facts)


def trace(kit: Kit) -> StepResult:
    """The driver's raw per-process samples under known loads (kit_trace.py), kept as trace.json."""
    step, seconds = "trace", 1.5 if kit.sim else 6.0
    phases, rows = [], []
    for phase in (p for p in kit_trace.PHASES if not kit.sim or p.on_sim):
        try:
            record = kit_trace.run_phase(kit, phase, seconds)
        except FAILURES as e:
            failed, facts = _failed(step, phase.name, "runs", e)
            rows += failed
            phases.append({"phase": phase.name, "failed": _why(e), **facts})
            continue
        phases.append(record)
        rows += kit_trace.rows(record)
    (kit.out / "trace.json").write_text(json.dumps({"gpu": kit.gpu.name, "uuid": kit.gpu.uuid, "sim": kit.sim,
                                                    "poll_s": kit_trace.POLL_S, "phases": phases}))  # fmt: skip
    summaries = {p["phase"]: kit_trace.summary(p) for p in phases if "whole" in p}
    return StepResult(step, rows, 0, {"file": "trace.json", "summary": summaries})


@dataclass(frozen=True)
class Step:
    name: str
    seconds: float  # what it takes on a real GPU, about: a call starts no step it cannot finish
    run: Callable[[Kit], StepResult]
    on_sim: bool  # runs on the simulator too (the driver API); the rest need cudart
    needs: tuple[str, ...] = ()  # Python modules, checked without importing them


# Seconds each step may take, about 1.3x what it took on the H200 and H100 (runs 2-4,
# tests/data/real-gpu/*/report.json) plus what it has done since: the selftest waits 4 s
# longer for a fit, the generate runs once untimed and twice a side, the trace two more
# phases, shares a tenant alone first. share-bias, lend and mps have not run yet: their
# tenants' seconds plus a matmul tenant's start (6-8 s). With these a lent GPU's 15
# minutes hold the steps that matter first in two device commands (docs/real-gpu.md).
STEPS = (
    Step("selftest", 60, selftest, True),  # 25-38 s
    Step("driver-api", 15, driver_api, True, ("cuda.bindings",)),  # 4 s
    Step("nvml-view", 10, nvml_view, True, ("pynvml",)),  # 1 s
    Step("pytorch", 30, pytorch, False, ("torch",)),  # 12-14 s
    Step("cupy", 30, cupy, False, ("cupy",)),  # 12-14 s
    Step("jax", 50, jax, False, ("jax",)),  # 30-31 s
    Step("nccl", 20, nccl, False, ("torch",)),  # 6 s
    Step("transformers", 90, transformers, False, ("torch", "transformers")),  # 45-48 s
    Step("cuda-graph", 30, cuda_graph, False, ("torch",)),  # 12-14 s
    Step("trace", 110, trace, True, ("cuda.bindings", "pynvml")),  # 67 s, 15 phases then
    Step("shares", 150, shares, False, ("torch",)),  # 69-83 s, then a tenant alone and an ungated pair first
    Step("share-bias", 180, share_bias, False, ("torch",)),  # alone, then three sets of up to 18 + 20 s
    Step("lend", 80, lend, False, ("torch",)),  # alone, then 18 + 8 + 10 s
    Step("cost", 120, cost, False, ("torch",)),  # 80-88 s
    Step("mps", 80, mps, False, ("torch",)),  # alone, then two runs of 12 s
)


def not_runnable(step: Step, sim: bool) -> list[Row]:
    """Rows saying why a step does not run here, or [] when it does."""
    if sim and not step.on_sim:
        return [skipped(step.name, step.name, NO_CUDART)]
    missing = [m for m in step.needs if importlib.util.find_spec(m.split(".")[0]) is None]
    return [skipped(step.name, step.name, f"{', '.join(missing)} not installed on this machine")] if missing else []


def run_step(step: Step, kit: Kit) -> StepResult:
    start = time.monotonic()
    rows = not_runnable(step, kit.sim)
    result = StepResult(step.name, rows, 0) if rows else step.run(kit)
    result.seconds = time.monotonic() - start
    return result

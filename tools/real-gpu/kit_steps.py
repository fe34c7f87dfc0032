"""The kit's steps, in order. Each runs its probes in temporary slices and
turns what it saw into rows; the rules that judge are the pure functions at
the top (tested on recorded outcomes, tests/unit/test_real_gpu_kit.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

import kit_trace
from kit_context import FAILURES, NO_CUDART, SHARE_POINTS, GiB, Kit, MiB, error_text, failed_case, failed_step, mib
from kit_report import Row, StepResult, check, skipped
from kit_shares import hard, lend, mps, share_bias, shares
from kit_slices import RECLAIM_S, Outcome, Probe, Sample, run_probe, wait_released, without_interposer
from probes.common import CHUNK  # what probes allocate at a time: the tolerance at the limit

from gpuslice import request
from gpuslice.cli.selftest_slices import slice_box, sm_use

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
        rows, facts = failed_case(step, label, "runs in a slice", e)
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
        return failed_step(step, "NVML inside a slice", "runs in a slice", e)
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
        first = error_text(e)
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
        failed, more = failed_case(step, f"{label}: without gpuslice", "runs", e)
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


def cuda_graph(kit: Kit) -> StepResult:
    step, share, seconds = "cuda-graph", 50, 8.0
    try:
        with slice_box(kit.client, kit.gpu, kit.layout, hard(share)) as box:
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
        return failed_step(step, "CUDA graph under a hard share", "runs in a slice", e)
    return StepResult(step, [
        check(step, "CUDA graph replay", "the same as the eager run", f"same: {result['same_as_eager']}, "
              f"{result['replays'] / result['seconds']:.0f} replays/s", result["same_as_eager"]),
        check(step, f"CUDA graph under hard {share} %", f"{share} ± {SHARE_POINTS:g} % (NVML)", f"{use:.1f} %",
              abs(use - share) <= SHARE_POINTS),
    ], 0, {"result": result, "sm_use": use})  # fmt: skip


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
        return failed_step(step, "cost", "runs in a slice", e)
    return StepResult(step, cost_rows(step, gated, direct), 0, {"gated": gated, "direct": direct})


def trace(kit: Kit) -> StepResult:
    """The driver's raw per-process samples under known loads (kit_trace.py), kept as trace.json."""
    step, seconds = "trace", 1.5 if kit.sim else 6.0
    phases, rows = [], []
    for phase in (p for p in kit_trace.PHASES if not kit.sim or p.on_sim):
        try:
            record = kit_trace.run_phase(kit, phase, seconds)
        except FAILURES as e:
            failed, facts = failed_case(step, phase.name, "runs", e)
            rows += failed
            phases.append({"phase": phase.name, "failed": error_text(e), **facts})
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

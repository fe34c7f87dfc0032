"""The real-GPU kit's steps, run by run.sh once gpuslice is installed: measure
what a context costs on this driver, start the daemon charging that per
context, then each step not yet done, as long as this call's budget lets it
finish. Steps done are kept under --state, so a cut call resumes; every call
writes report.json and report.md (every row so far) to --out.

Exit status: 0 every step done and no check failed, 1 a check failed,
2 the kit could not start, 3 steps left for the next call."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import logging
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

import click
import pynvml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the kit's modules, beside this file

import kit_fits
from kit_node import SIM_CONFIG, Daemon, LogLines, NodeError, NodePaths, context_cost, generate_spec, write_config
from kit_report import FAIL, StepResult, as_json, as_markdown, begin_call, calls, check, load, load_all, save
from kit_shares import REFINE
from kit_steps import STEPS, Kit, not_runnable, run_step

from gpuslice import inventory
from gpuslice.allocator import config as daemon_config
from gpuslice.cli import selftest_node
from gpuslice.client import AllocatorClient
from gpuslice.paths import built_executable

log = logging.getLogger("real-gpu")
TWO_MIB = 2 << 20
TICKS = " ticks in "  # the daemon's summary of its controller's ticks (gpuslice.allocator.compute.ticks)
# the daemon's lines on the costs it fits and measures again (gpuslice.allocator.cost_split, INFO)
COSTS = ("fitting the costs", "costs fitted", "costs drifted", *REFINE)
VERSIONS = ("torch", "jax", "jaxlib", "cupy-cuda13x", "cupy-cuda12x", "transformers", "cuda-bindings",
            "nvidia-ml-py", "nvidia-nccl-cu13", "nvidia-nccl-cu12", "grpcio")  # fmt: skip


def machine(inv: inventory.Inventory, gpu: inventory.Gpu, reserve: int, sim: bool) -> dict:
    versions = {}
    for name in VERSIONS:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    rev = os.environ.get("GPUSLICE_KIT_REV") or "commit unknown"
    cuda = inv.cuda_version
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "driver": f"{'simulator ' if sim else ''}{inv.driver_version}, CUDA {cuda // 1000}.{cuda % 1000 // 10}",
        "gpu": f"{gpu.index}: {gpu.name}, {gpu.memory_total >> 20} MiB, {gpu.uuid}",
        "python": platform.python_version(),
        "kernel": platform.release(),
        "packages": ", ".join(f"{k} {v}" for k, v in versions.items()),
        "context cost": f"{reserve >> 20} MiB per context (measured; the daemon's context_reserve)",
        # the installed package, and the commit run.sh found for its tree (never another repository's)
        "gpuslice": f"{importlib.metadata.version('gpuslice')} ({rev})",
    }


def reserve_for(paths: NodePaths, state: Path, gpu: inventory.Gpu) -> int:
    """The measured context cost, rounded up to 2 MiB; measured once per machine and kept."""
    cached = state / "context.json"
    try:
        return int(json.loads(cached.read_text())["reserve"])
    except (OSError, ValueError, KeyError):
        pass
    cost = context_cost(gpu.uuid)
    reserve = -(-cost // TWO_MIB) * TWO_MIB
    cached.write_text(json.dumps({"measured": cost, "reserve": reserve, "gpu": gpu.uuid}))
    return reserve


def report(out: Path, state: Path, facts: dict, pending: list[str]) -> list[StepResult]:
    """Every step's results the state holds, from every call, written to --out and the state."""
    results = load_all(state, [s.name for s in STEPS])
    history = calls(state)
    for where in (out, state):
        (where / "report.json").write_text(json.dumps(as_json(facts, results, pending, history), indent=1))
        (where / "report.md").write_text(as_markdown(facts, results, pending, history))
    return results


@click.command()
@click.option("--sim", is_flag=True, help="on the simulator: the kit's own check where there is no GPU")
@click.option("--state", type=click.Path(file_okay=False, path_type=Path), required=True, help="steps done, kept")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True, help="the reports")
@click.option("--work", type=click.Path(file_okay=False, path_type=Path), required=True, help="sockets, daemon")
@click.option("--budget", type=click.FloatRange(30, 3600), default=540, show_default=True,
              help="seconds this call may take: no step starts that would not finish")  # fmt: skip
@click.option("--only", multiple=True, type=click.Choice([s.name for s in STEPS]), help="these steps only")
@click.option("--again", is_flag=True, help="run steps again that an earlier call did")
@click.option("--gpu", "gpu_index", type=int, default=0, show_default=True)
@click.option("--daemon", "settings", multiple=True, callback=lambda _c, _p, v: tuple(map(_setting, v)),
              metavar="KEY=VALUE", help="a daemon config setting for this call (compute_fit_base=even)")  # fmt: skip
def main(
    sim: bool,
    state: Path,
    out: Path,
    work: Path,
    budget: float,
    only: tuple[str, ...],
    again: bool,
    gpu_index: int,
    settings: tuple[str, ...],
) -> None:
    """Run the kit's steps on this node's GPU (root)."""
    start = time.monotonic()
    logging.basicConfig(level=logging.INFO, format="real-gpu: %(message)s", stream=sys.stdout)
    if os.geteuid() != 0:
        click.echo("real-gpu: run as root: slices are bound to new pid namespaces", err=True)
        sys.exit(2)
    for d in (state, out, work):
        d.mkdir(parents=True, exist_ok=True)
    paths = NodePaths(work, sim)
    try:
        _, results, pending = _run(paths, state, out, start + budget, only, again, gpu_index, settings)
    except NodeError as e:
        click.echo(f"real-gpu: {e}", err=True)
        sys.exit(2)
    latest = {res.step: res for res in results}  # earlier runs come first: a step run again is judged anew
    failed = sum(r.verdict == FAIL for res in latest.values() for r in res.rows)
    log.info("%d steps done, %d checks failed%s", len(latest), failed,
             f"; not run yet: {', '.join(pending)} (call again to resume)" if pending else "")  # fmt: skip
    sys.exit(3 if pending else 1 if failed else 0)


def _setting(text: str) -> str:
    """KEY=VALUE as the config's `key: value` line; the daemon checks it against its schema."""
    key, sep, value = text.partition("=")
    if not sep or not re.fullmatch(r"[a-z_]+", key) or not value or "\n" in value:
        raise click.BadParameter(f"{text!r}: KEY=VALUE, a top-level daemon config key such as compute_fit_base=even")
    return f"{key}: {value}"


def _run(
    paths: NodePaths,
    state: Path,
    out: Path,
    deadline: float,
    only: tuple[str, ...],
    again: bool,
    gpu_index: int,
    settings: tuple[str, ...] = (),
) -> tuple[dict, list[StepResult], list[str]]:
    if paths.sim:
        import gpuslice_sim as simulator

        paths.sim_config.write_text(SIM_CONFIG)
        paths.sim_state.mkdir(exist_ok=True)
        os.environ.update(simulator.environment(config=str(paths.sim_config), state_dir=str(paths.sim_state)))
        simulator.activate()
    try:
        inv = inventory.read()
        pynvml.nvmlInit()  # held for the call: the kit reads what the driver counts per process
    except (inventory.NoDriver, pynvml.NVMLError) as e:
        raise NodeError(f"no driver: {e}") from e
    gpu = next((g for g in inv.gpus if g.index == gpu_index), None)
    if gpu is None:
        raise NodeError(f"--gpu {gpu_index}: this node has GPUs {[g.index for g in inv.gpus]}")
    reserve = reserve_for(paths, state, gpu)
    log.info("one context costs %d MiB on this driver: the daemon charges that per context", reserve >> 20)
    write_config(paths, reserve, settings)
    gpuslice = Path(sys.executable).parent / "gpuslice"
    generate_spec(paths, gpuslice, built_executable("gpuslice-hook"), out / "kit.log")
    (out / "cdi-spec.json").write_text(paths.spec.read_text())
    try:
        cfg = daemon_config.load(str(paths.config))
    except daemon_config.ConfigError as e:  # a --daemon setting the daemon does not take
        raise NodeError(str(e).replace("\n", "; ")) from e
    facts = machine(inv, gpu, reserve, paths.sim)
    daemon = Daemon(paths, out / "daemon.log")
    try:
        return _steps(paths, state, out, deadline, only, again, gpu, cfg, reserve, gpuslice, facts)
    finally:
        daemon.stop()


def _steps(paths: NodePaths, state: Path, out: Path, deadline: float, only: tuple[str, ...], again: bool,
           gpu: inventory.Gpu, cfg: daemon_config.Config, reserve: int, gpuslice: Path,
           facts: dict) -> tuple[dict, list[StepResult], list[str]]:  # fmt: skip
    checks, inv = selftest_node.driver(cfg)
    if inv is None:
        raise NodeError(f"NVML: {checks[0].observed}")
    with tempfile.TemporaryDirectory(prefix="gpuslice-kit-view-") as view:
        spec_checks, layout = selftest_node.cdi(inv, paths.spec, paths.sim, Path(view))
        if layout is None:
            raise NodeError(f"the CDI spec: {spec_checks[-1].observed}")
        pending: list[str] = []
        call = begin_call(
            state, {"date": facts["date"], "gpuslice": facts["gpuslice"], "options": " ".join(sys.argv[1:])}
        )
        # how long the controller's ticks took, and the costs it fitted: each step keeps the log's
        # lines that came by its end
        said = LogLines(paths.work / "daemon.log")
        fitted = LogLines(paths.work / "daemon.log")  # each fit's rows, and the readings after it
        with AllocatorClient(str(paths.socket), timeout=30) as client:
            kit = Kit(client, gpu, layout, paths.sim, reserve, deadline, paths.config, paths.spec, gpuslice, out,
                      paths.work / "slices", paths.work / "daemon.log")  # fmt: skip
            for step in (s for s in STEPS if not only or s.name in only):
                if not again and load(step.name, state) is not None:
                    continue
                if not not_runnable(step, paths.sim) and time.monotonic() + step.seconds > deadline:
                    pending.append(step.name)
                    continue
                log.info("%s ...", step.name)
                result = run_step(step, kit)
                result.call = call
                lines = said.new(TICKS, *COSTS)
                if ticks := [line for line in lines if TICKS in line]:
                    result.facts["controller_ticks"] = ticks
                if costs := [line for line in lines if TICKS not in line]:
                    result.facts["costs"] = costs
                about_fits = fitted.new(*kit_fits.MARKERS)
                if steady := kit_fits.stretches(about_fits):  # a thread's time alone and shared
                    result.facts["stretches"] = [st.summary() for st in steady]
                if fits := kit_fits.read(about_fits):
                    result.facts["fits"] = [f.summary() for f in fits]
                    result.rows += [check(step.name, f"the daemon's fit {i}", "a fact: its rows by whose boost, "
                                          "and the readings after it, against its costs", kit_fits.describe(f), None)
                                    for i, f in enumerate(fits, 1)]  # fmt: skip
                save(result, state)
                bad = [f"{r.name} ({r.observed})" for r in result.rows if r.verdict == FAIL]
                log.info("%s: %d rows in %.0f s%s", step.name, len(result.rows), result.seconds,
                         f"; FAILED: {'; '.join(bad)}" if bad else "")  # fmt: skip
                report(out, state, facts, pending)
        return facts, report(out, state, facts, pending), pending


if __name__ == "__main__":
    main()

"""The interposer's cost per call, measured side by side with the simulator
it wraps: nanoseconds, and instructions under callgrind (repeatable whatever
else the machine does), for a forwarded call, cuMemAlloc+cuMemFree, and
cuLaunchKernel through the launch gate (under budget: the slice's gate is
open or has tokens left).  As root the interposer runs enforcing a slice
(daemon and a container's pid namespace); otherwise in pass-through mode, and
says so."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import click
import yaml

import gpuslice_sim
from gpuslice.cli import sim_daemon
from gpuslice.cli.pid_namespace import PidNamespace
from gpuslice.paths import native_dir

ROOT = Path(__file__).resolve().parents[1]
OPS = ("forwarded:cuCtxGetCurrent", "cuMemAlloc+cuMemFree", "cuLaunchKernel", "cuLaunchKernel:rejected")
PER_CALL = {
    "forwarded:cuCtxGetCurrent": 1,
    "cuMemAlloc+cuMemFree": 10,
    "cuLaunchKernel": 10,
    "cuLaunchKernel:rejected": 1,
}


def _binary(tmp: Path) -> Path:
    subprocess.run(["make", "-s", "-C", ROOT, f"BUILD={tmp}", "bench"], check=True)
    return tmp / "bench" / "call_bench"


def _times(cmd: list[str], env: dict[str, str], n: int) -> dict[str, float]:
    out = subprocess.run([*cmd, str(n)], env=env, capture_output=True, text=True, check=True).stdout
    return {line.split()[0]: float(line.split()[1]) for line in out.splitlines() if line.split()[0] in OPS}


def _instructions(cmd: list[str], env: dict[str, str], n: int, tmp: Path, tag: str) -> dict[str, float]:
    prefix = tmp / f"cg-{tag}"
    vg = ["valgrind", "--tool=callgrind", "--collect-atstart=no", f"--callgrind-out-file={prefix}.%p"]
    subprocess.run([*cmd[:-2], *vg, *cmd[-2:], str(n)], env=env, capture_output=True, check=True)
    result = {}
    for f in tmp.glob(f"cg-{tag}.*"):
        text = f.read_text(errors="replace")
        label = re.search(r"Client Request: (\S+)", text)
        total = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
        if label and total and label.group(1) in OPS:
            calls = n / PER_CALL[label.group(1)]
            result[label.group(1)] = int(total.group(1)) / calls
    return result


def _enforced_env(tmp: Path, sim_cfg: Path) -> tuple[dict[str, str], list[str], callable]:
    d_dir = tmp / "daemon"
    d_dir.mkdir()
    cfg = sim_daemon.write_config(d_dir, [{"memory": "80Gi", "wave_time": "1ns"}])
    d = sim_daemon.start(d_dir, cfg)
    box = PidNamespace()
    with d.client() as c:
        c.reserve("bench", {"gpuslice.io/memory": "64Gi", "gpuslice.io/cores": "50"})
        c.bind("bench", box.init_pid)
    env = {
        "GPUSLICE_SLICE_SOCKET": str(d.slice_socket),
        "GPUSLICE_SIM_CONFIG": str(d_dir / "sim.yaml"),
        "GPUSLICE_SIM_STATE_DIR": str(d_dir / "sim"),
    }

    def stop() -> None:
        box.stop()
        d.kill()

    return env, box.command([]), stop


def main() -> None:
    if not shutil.which("valgrind"):
        raise click.ClickException("valgrind is needed for instruction counts (apt-get install valgrind)")
    with tempfile.TemporaryDirectory(prefix="gpuslice-bench-") as t:
        tmp = Path(t)
        exe = _binary(tmp)
        sim_cfg = tmp / "sim.yaml"
        sim_cfg.write_text(yaml.safe_dump({"gpus": [{"memory": "80Gi", "wave_time": "1ns"}]}))
        sim_lib = gpuslice_sim.lib_dir() / "libcuda.so.1"
        base = {**os.environ, "GPUSLICE_REAL_LIBCUDA": str(sim_lib)}
        if os.geteuid() == 0 and shutil.which("unshare"):
            extra, prefix, stop = _enforced_env(tmp, sim_cfg)
            mode = "enforcing a slice"
        else:
            extra = {"GPUSLICE_ALLOW_UNSLICED": "1", "GPUSLICE_SIM_CONFIG": str(sim_cfg),
                     "GPUSLICE_SIM_STATE_DIR": str(tmp / "sim")}  # fmt: skip
            prefix, stop, mode = [], (lambda: None), "pass-through (not root: no slice)"
        env = {**base, **extra}
        try:
            direct = [*prefix, str(exe), str(sim_lib)]
            wrapped = [*prefix, str(exe), str(native_dir() / "wrap" / "libcuda.so.1")]
            ns = {"direct": _times(direct, env, 200000), "interposer": _times(wrapped, env, 200000)}
            ir = {
                "direct": _instructions(direct, env, 20000, tmp, "direct"),
                "interposer": _instructions(wrapped, env, 20000, tmp, "wrap"),
            }
        finally:
            stop()
    click.echo(f"interposer {mode}, simulator behind it; per call, measured in one run")
    click.echo(
        f"  {'call':<28}{'direct ns':>10}{'wrapped ns':>11}{'added ns':>9}{'direct Ir':>11}"
        f"{'wrapped Ir':>11}{'added Ir':>9}"
    )
    for op in OPS:
        d_ns, w_ns = ns["direct"][op], ns["interposer"][op]
        d_ir, w_ir = ir["direct"].get(op, float("nan")), ir["interposer"].get(op, float("nan"))
        click.echo(
            f"  {op:<28}{d_ns:>10.1f}{w_ns:>11.1f}{w_ns - d_ns:>9.1f}{d_ir:>11.0f}{w_ir:>11.0f}{w_ir - d_ir:>9.0f}"
        )

"""The demo with real containers: the daemon on the simulator, the CDI spec,
and three containers with different slices on one simulated GPU (Podman and
runc; containerd's ctr with the runtime shim where Podman is absent)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gpuslice import paths
from gpuslice.cdi.registry import DYNAMIC_DIR
from gpuslice.cdi.registry import Registry as CdiRegistry
from gpuslice.cli import rootfs, sim_daemon
from gpuslice.cli.status_table import render_status
from gpuslice.units import format_bytes

SPEC = DYNAMIC_DIR / "gpuslice-demo.json"
PODMAN = ["--runtime", "runc", "--network", "none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
SLICES = (
    ("small", {"gpuslice.io/memory": "2Gi", "gpuslice.io/cores": "20"}),
    ("medium", {"gpuslice.io/memory": "4Gi", "gpuslice.io/cores": "30"}),
    ("quarter", {"gpuslice.io/memory": "25%", "gpuslice.io/cores": "50"}),
)
HOLD_SECONDS = 4
# hard shares, each container saturating the GPU with 100 us kernels
COMPUTE = (("twenty", 20), ("thirty", 30), ("fifty", 50))
MEASURE_FROM, MEASURE_FOR = 3.0, 5.0  # seconds after the last container's first report, or after the daemon has
# fitted their costs (where the driver gives each period to one process, docs/compute.md) within this: three
# slices that join a second or two apart as their containers start fit again as each joins, and a fit takes
# up to 16 rows (about 10 s at the H100's 200 ms periods); 6 s, the wait until stop 58, measured a slow
# machine's demo inside the fit (17.5 / 23.2 / 28.5 % for 20 / 30 / 50)
FIT_WAIT = 14.0
LOAD_SECONDS = MEASURE_FROM + FIT_WAIT + MEASURE_FOR + 1


class DemoUnavailable(RuntimeError):
    pass


@dataclass
class Runner:
    name: str
    start: Callable[[str, dict[str, str], list[str]], subprocess.Popen]  # (name, annotations, argv)


def available() -> str | None:
    """Why the container demo cannot run here, or None."""
    if os.geteuid() != 0:
        return "containers need root"
    if not shutil.which("runc"):
        return "runc is not installed"
    if not (shutil.which("podman") or shutil.which("ctr")):
        return "neither podman nor containerd's ctr is installed"
    return None


def _podman(root: Path) -> Runner:
    def start(name: str, annotations: dict[str, str], argv: list[str]) -> subprocess.Popen:
        notes = [a for k, v in annotations.items() for a in ("--annotation", f"{k}={v}")]
        return subprocess.Popen(
            ["podman", "run", "--rm", "--name", name, *PODMAN, "--device", "gpuslice.io/gpu=0", *notes,
             "--rootfs", str(root), *argv],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    return Runner("Podman + runc, CDI device gpuslice.io/gpu=0 and the hook", start)


def _ctr(root: Path, shim: Path) -> Runner:
    def start(name: str, annotations: dict[str, str], argv: list[str]) -> subprocess.Popen:
        notes = [a for k, v in annotations.items() for a in ("--annotation", f"{k}={v}")]
        return subprocess.Popen(
            ["ctr", "run", "--rm", "--runc-binary", str(shim), *notes, "--rootfs", str(root), name, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    return Runner("containerd (ctr) + the gpuslice runtime shim", start)


@dataclass
class SimNode:
    """A daemon on the simulator with its CDI spec installed, a root
    filesystem, and the runtime shim pointed at the daemon."""

    daemon: sim_daemon.RunningDaemon
    work: Path
    root: Path
    shim: Path


@contextlib.contextmanager
def sim_node(echo=print) -> Iterator[SimNode]:
    why = available()
    if why:
        raise DemoUnavailable(why)
    others = [p for p, _, _ in CdiRegistry().specs() if p != SPEC]
    if others:
        raise DemoUnavailable(f"another gpuslice CDI spec is installed ({others[0]}); the demo would collide with it")
    with tempfile.TemporaryDirectory(prefix="gpuslice-demo-") as tmp:
        work = Path(tmp)
        cfg = sim_daemon.write_config(work, [{"memory": "16Gi", "name": "NVIDIA A100 16GB (simulated)"}])
        daemon = sim_daemon.start(work, cfg)
        try:
            _install_spec(daemon, echo)
            shim = sim_daemon.shim_for(daemon, SPEC, work / "gpuslice-runtime", paths.executable("gpuslice-runtime"))
            yield SimNode(daemon, work, rootfs.build(work / "rootfs"), shim)
        finally:
            SPEC.unlink(missing_ok=True)
            daemon.kill(15)


def run(echo=print) -> None:
    with sim_node(echo) as node:
        _show(node, echo)
    echo("\ncleaned up: containers exited, slices released, CDI spec removed, daemon stopped")


def _install_spec(daemon: sim_daemon.RunningDaemon, echo) -> None:
    gen = sim_daemon.cdi_generate(daemon, SPEC)
    if gen.returncode != 0:
        raise RuntimeError(f"cdi generate failed: {gen.stderr.strip()}")
    echo(gen.stdout.strip())


def _show(node: SimNode, echo) -> None:
    daemon = node.daemon
    if shutil.which("podman"):
        runner = _podman(node.root)
    else:
        if subprocess.run(["ctr", "version"], capture_output=True).returncode != 0:
            raise DemoUnavailable("containerd is not running (start it: containerd &)")
        runner = _ctr(node.root, node.shim)
    echo(f"\n== three containers on one simulated GPU: {runner.name} ==")
    procs = {}
    for name, asks in SLICES:
        procs[name] = runner.start(
            f"gpuslice-demo-{name}-{os.getpid()}", asks, [rootfs.PROBE, "256", str(HOLD_SECONDS)]
        )
        echo(f"started {name}: {', '.join(f'{k}={v}' for k, v in asks.items())}")
    time.sleep(HOLD_SECONDS / 2)
    with daemon.client() as c:
        echo("\n== gpuslice status, while they run ==")
        echo(render_status(c.inventory(), c.list()))
    echo("\n== what each container saw ==")
    for name, p in procs.items():
        out, err = p.communicate(timeout=120)
        if p.returncode != 0:
            raise RuntimeError(f"container {name} failed: {err.strip() or out.strip()}")
        r = json.loads(out.strip().splitlines()[-1])
        echo(
            f"{name:<8} sees total {format_bytes(r['total'])}, allocated {format_bytes(r['allocated'])}, "
            f"then {r['then']}"
        )
    deadline = time.monotonic() + 10
    with daemon.client() as c:
        while c.list() and time.monotonic() < deadline:
            time.sleep(0.2)
        echo("\n== gpuslice status, after they exited ==")
        echo(render_status(c.inventory(), c.list()))
    _show_compute(runner, daemon, echo)


def _show_compute(runner: Runner, daemon: sim_daemon.RunningDaemon, echo) -> None:
    echo(f"\n== compute shares: three containers saturating the GPU for {LOAD_SECONDS} s, hard shares ==")
    procs = {}
    for name, cores in COMPUTE:
        asks = {"gpuslice.io/memory": "1Gi", "gpuslice.io/cores": str(cores), "gpuslice.io/compute-policy": "hard"}
        argv = [rootfs.LOAD, str(LOAD_SECONDS), "100"]
        procs[name] = runner.start(f"gpuslice-demo-{name}-{os.getpid()}", asks, argv)
        echo(f"started {name}: {', '.join(f'{k}={v}' for k, v in asks.items())}")
    with daemon.client() as c:  # all of the daemon's slices are these
        fitted = c.compute_settled(None, MEASURE_FROM + FIT_WAIT, at_least=len(COMPUTE))
    points = {}
    for name, p in procs.items():
        out, err = p.communicate(timeout=120)
        if p.returncode != 0:
            raise RuntimeError(f"container {name} failed: {err.strip() or out.strip()}")
        lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
        points[name] = {x["t"]: x["busy"] for x in lines if "t" in x}
    t0 = max(min(p) for p in points.values())
    a = max(t0 + int(MEASURE_FROM * 1e9), (fitted or 0) + 500_000_000)
    b = a + int(MEASURE_FOR * 1e9)
    waited = fitted is not None and a > t0 + MEASURE_FROM * 1e9
    after = f"{(a - t0) / 1e9:.1f} s" + (" (the daemon fitted their costs first)" if waited else "")
    if fitted is None:  # said, not hidden: while a fit runs each slice gets part of its share
        after += (
            f" (the daemon had not fitted their costs within {MEASURE_FROM + FIT_WAIT:g} s: measured while it fits)"
        )
    echo(f"GPU time each used over {MEASURE_FOR:g} s from {after} (the simulator's own accounting):")
    for name, cores in COMPUTE:
        at = points[name]
        lo = min(t for t in at if t >= a)
        hi = max(t for t in at if t <= b)
        echo(f"{name:<8} share {cores:>3} %   measured {100 * (at[hi] - at[lo]) / (hi - lo):5.1f} %")

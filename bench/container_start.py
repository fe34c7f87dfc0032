"""Container start time with gpuslice (CDI + hook, and shim + hook) against
plain runc on the same root filesystem: paired runs, interleaved, so machine
noise hits both sides alike.  Needs root and Podman."""

from __future__ import annotations

import statistics
import subprocess
import time

import click

from gpuslice.cli import container_demo

PAIRS = 15


def _time(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise click.ClickException(f"{' '.join(cmd[:6])}...: {r.stderr.strip()}")
    return (time.perf_counter() - t0) * 1000


def main() -> None:
    with container_demo.sim_node(echo=lambda *_: None) as node:
        base = ["podman", "run", "--rm", *container_demo.PODMAN]
        plain = [*base, "--rootfs", str(node.root), "/bin/true"]
        variants = {
            "CDI device + hook": [*base, "--device", "gpuslice.io/gpu=0", "--annotation", "gpuslice.io/memory=1Gi",
                                  "--rootfs", str(node.root), "/bin/true"],
            "runtime shim + hook": [*base, "--runtime", str(node.shim), "--annotation", "gpuslice.io/memory=1Gi",
                                    "--rootfs", str(node.root), "/bin/true"],
        }  # fmt: skip
        _time(plain)  # warm caches once
        click.echo(f"container start to exit, /bin/true, {PAIRS} interleaved pairs each (median, ms)")
        for name, cmd in variants.items():
            pairs = [(_time(plain), _time(cmd)) for _ in range(PAIRS)]
            p = statistics.median(a for a, _ in pairs)
            g = statistics.median(b for _, b in pairs)
            added = statistics.median(b - a for a, b in pairs)
            click.echo(
                f"  {name:<22} plain runc {p:7.1f}   gpuslice {g:7.1f}   added {added:6.1f}   ratio {g / p:5.2f}"
            )

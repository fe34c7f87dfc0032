"""`gpuslice selftest`: is this node right? The node's checks, then the
slices' on each GPU (cli/selftest_node.py, cli/selftest_slices.py); one
table or JSON, and a status that is 0 only if every check passed."""

from __future__ import annotations

import os
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gpuslice.allocator.config import Config
from gpuslice.cli import selftest_node as node
from gpuslice.cli import selftest_shares as shares
from gpuslice.cli import selftest_slices as slices
from gpuslice.cli.selftest_report import Check
from gpuslice.client import AllocatorClient


@dataclass(frozen=True)
class Options:
    cfg: Config
    spec_file: Path | None
    memory: int  # each GPU's temporary slice
    seconds: float  # how long the shares are measured
    gpus: tuple[int, ...]  # which GPUs; () all
    shares: bool = True


class Stopped(Exception):
    pass


def _stop(signum: int, _frame: object) -> None:
    raise Stopped(f"stopped by {signal.Signals(signum).name}")


def run(opts: Options) -> list[Check]:
    # SIGTERM and SIGHUP unwind like Ctrl-C: the temporary slices are released on the way out
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop)
    with tempfile.TemporaryDirectory(prefix="gpuslice-selftest-") as view:
        return _run(opts, Path(view))


def _run(opts: Options, view: Path) -> list[Check]:
    checks, inv = node.driver(opts.cfg)
    if inv is None:
        return checks
    checks.append(node.daemon(opts.cfg, inv))
    spec_checks, layout = node.cdi(inv, opts.spec_file, opts.cfg.nvml == "sim", view)
    checks += spec_checks
    spec_matches = checks[-1]
    checks.append(node.runtimes())
    if (kubelet := node.kubelet_resources()) is not None:
        checks.append(kubelet)
    if layout is None or spec_matches.passed is False or not all(c.passed for c in checks[:3]):
        return checks  # no slices without a daemon, a spec and the driver's files
    if os.geteuid() != 0:
        return [*checks, Check("slices", "run as root", "not root: slices are bound to new pid namespaces", False)]
    gpus = [g for g in inv.gpus if not opts.gpus or g.index in opts.gpus]
    with AllocatorClient(opts.cfg.socket, timeout=10) as client:
        for gpu in gpus:
            checks += slices.memory_checks(client, gpu, layout, opts.memory, opts.cfg.context_reserve)
            if opts.shares:
                checks += shares.share_checks(client, gpu, layout, opts.seconds, opts.cfg.context_reserve)
    return checks

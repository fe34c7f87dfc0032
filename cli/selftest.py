"""`gpuslice selftest`: is this node right? The node's checks, then the
slices' on each GPU, every GPU at once (cli/selftest_node.py,
cli/selftest_slices.py); one table or JSON, and a status that is 0 only if
every check passed."""

from __future__ import annotations

import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from gpuslice import stop_signals
from gpuslice.allocator.config import Config
from gpuslice.cli import selftest_node as node
from gpuslice.cli import selftest_shares as shares
from gpuslice.cli import selftest_slices as slices
from gpuslice.cli.selftest_report import Check
from gpuslice.client import AllocatorClient
from gpuslice.inventory import Gpu


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


def run(opts: Options) -> list[Check]:
    # SIGTERM and SIGHUP unwind like Ctrl-C, whichever thread got them: the temporary slices
    # are released on the way out
    stop_signals.raise_on_signals(lambda s: Stopped(f"stopped by {s.name}"))
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
        return checks + _each_gpu(client, gpus, layout, opts)


def _each_gpu(client: AllocatorClient, gpus: list[Gpu], layout: node.Layout, opts: Options) -> list[Check]:
    """Every GPU's slices checked side by side, one thread each: a GPU's checks use
    no other GPU, so a node of eight takes as long as one. Stopped, the threads
    are halted and unwind through their slices' releases before this returns."""
    halt = slices.Halt()
    with ThreadPoolExecutor(max_workers=max(len(gpus), 1), thread_name_prefix="selftest-gpu") as pool:
        futures = [pool.submit(_gpu_checks, client, gpu, layout, opts, halt) for gpu in gpus]
        try:
            return [c for f in futures for c in f.result()]
        except BaseException:
            halt()  # leaving the pool waits for every GPU's thread to unwind
            raise


def _gpu_checks(
    client: AllocatorClient, gpu: Gpu, layout: node.Layout, opts: Options, halt: slices.Halt
) -> list[Check]:
    reserve = opts.cfg.context_reserve
    checks = slices.memory_checks(client, gpu, layout, opts.memory, halt, reserve)
    if opts.shares:
        checks += shares.share_checks(client, gpu, layout, opts.seconds, halt, reserve)
    return checks

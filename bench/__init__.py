"""Benchmarks, separate from tests (developer tooling, not shipped): each prints
ratios measured side by side.  Run: ./dev.sh bench [NAME...]"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpuslice.cli import sim_daemon

TMPFS = Path("/dev/shm")


@contextmanager
def node(gpus: list[dict], **overrides: object) -> Iterator[sim_daemon.RunningDaemon]:
    """A daemon on the simulator with its slice files on a tmpfs, as on a node
    (/run/gpuslice/ledgers), not on the disk; gone afterwards."""
    with tempfile.TemporaryDirectory(prefix="gpuslice-bench-") as tmp:
        shm = Path(tempfile.mkdtemp(prefix="gpuslice-bench-", dir=TMPFS if TMPFS.is_dir() else None))
        d = sim_daemon.start(
            Path(tmp), sim_daemon.write_config(Path(tmp), gpus, slice_files_dir=str(shm / "slices"), **overrides)
        )
        try:
            yield d
        finally:
            d.kill()
            shutil.rmtree(shm, ignore_errors=True)

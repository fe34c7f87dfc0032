"""A node's GPU side for the runtime tests: the daemon on one simulated GPU,
its CDI spec in /var/run/cdi (where runtimes look), and the shim pointed at
this daemon, as a runtime's configuration would name it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpuslice.cdi.registry import Registry
from gpuslice.cli import sim_daemon
from gpuslice.paths import built_executable


@dataclass
class GpuNode:
    daemon: sim_daemon.RunningDaemon
    shim: Path

    def slices(self) -> list:
        return list(self.daemon.client().list())

    def wait_slices(self, want: int, seconds: float = 15) -> list:
        deadline = time.monotonic() + seconds
        while len(found := self.slices()) != want and time.monotonic() < deadline:
            time.sleep(0.1)
        return found


@contextmanager
def gpu_node(work: Path, spec: Path, memory: str = "16Gi", gpus: int = 1) -> Iterator[GpuNode]:
    config = sim_daemon.write_config(work, [{"memory": memory}] * gpus, sweep_interval=0.5)
    daemon = sim_daemon.start(work, config)
    try:
        made = sim_daemon.cdi_generate(daemon, spec)
        assert made.returncode == 0, made.stderr
        assert_alone_in_its_directory(spec)
        yield GpuNode(
            daemon, sim_daemon.shim_for(daemon, spec, work / "gpuslice-runtime", built_executable("gpuslice-runtime"))
        )
    finally:
        spec.unlink(missing_ok=True)
        daemon.kill(15)


def assert_alone_in_its_directory(spec: Path) -> None:
    """No other file of the spec's directory defines its devices: where two do, runtimes use
    neither (the CDI conflict rule), and every runtime test would fail as if gpuslice were
    wrong. A run killed before its clean-up leaves its spec behind."""
    specs = {path: s for path, _, s in Registry((spec.parent,)).specs()}
    mine = specs.pop(spec)
    names = {d.name for d in mine.devices}
    clash = {path: sorted(names & {d.name for d in s.devices}) for path, s in specs.items()}
    said = [f"{path} also defines {mine.kind}={','.join(both)}" for path, both in clash.items() if both]
    assert not said, f"{'; '.join(said)}: runtimes use neither; left by a run killed before its clean-up? remove it"

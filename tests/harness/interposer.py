"""One container holding a slice, with the interposer in front of the
simulator: a daemon, the reservation bound to a process in its own pid
namespace, and agents that run CUDA calls there."""

from __future__ import annotations

from gpuslice.allocator.slice_files import SliceFiles
from tests.harness import REPO, interposer_env
from tests.harness.machine import Agent, Container, gpu


class Slice:
    """A daemon on the simulator, one container holding a slice, and the
    environment that puts the interposer in front of the simulator."""

    def __init__(self, daemon, containers, memory: str, gpu_memory: str = "16Gi", sim: dict | None = None,
                 **config) -> None:  # fmt: skip
        self.d = daemon([gpu(gpu_memory, **(sim or {}))], **config)
        self.client = self.d.client()
        self.box: Container = containers()
        self.slice = self.client.reserve("box", {"gpuslice.io/memory": memory, "gpuslice.io/cores": "50"})
        self.client.bind("box", self.box.init_pid)
        self.files = SliceFiles(self.d.slice_files_dir, self.slice.id)
        self.env = wrapped_env(self.d)

    def agent(self, agents_started: list) -> Agent:
        a = Agent(self.env, prefix=self.box.command([]))
        agents_started.append(a)
        assert a.call("init")["error"] == "CUDA_SUCCESS"
        return a

    def used(self) -> int:
        return int(self.files.usage.used[0])


def wrapped_env(d) -> dict[str, str]:
    return {**interposer_env(d), "PYTHONPATH": str(REPO)}

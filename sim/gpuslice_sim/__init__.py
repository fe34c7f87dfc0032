"""The simulated NVIDIA driver seen from Python: where it is, how a process
uses it, and config checks through the simulator's own parser.

This package (gpuslice-sim) stands alone: it imports nothing of gpuslice, so a
node package never needs it and any CUDA program can run on it."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

CONFIG_ENV = "GPUSLICE_SIM_CONFIG"
STATE_DIR_ENV = "GPUSLICE_SIM_STATE_DIR"
DEFAULT_STATE_DIR = "/tmp/gpuslice-sim"


def lib_dir() -> Path:
    """The simulator's libcuda.so.1, libnvidia-ml.so.1 and bundled machine,
    beside this module (a link to the build directory in a checkout)."""
    return Path(__file__).resolve().parent / "_native"


class SimError(RuntimeError):
    """The simulator is missing or its config is unusable."""


@dataclass(frozen=True)
class SimLibs:
    cuda: Path
    nvml: Path
    default_config: Path


def libs() -> SimLibs:
    d = lib_dir()
    found = SimLibs(d / "libcuda.so.1", d / "libnvidia-ml.so.1", d / "gpuslice-sim.yaml")
    if not found.cuda.exists() or not found.nvml.exists():
        raise SimError(f"simulator libraries not built in {d} (run: make sim, or pip install ./sim)")
    return found


def environment(config: str | None = None, state_dir: str | None = None) -> dict[str, str]:
    """Variables that make a child process load the simulator as its driver."""
    env = {"LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(lib_dir()), os.environ.get("LD_LIBRARY_PATH")]))}
    if config:
        env[CONFIG_ENV] = str(config)
    if state_dir:
        env[STATE_DIR_ENV] = str(state_dir)
    return env


def activate(config: str | None = None, state_dir: str | None = None) -> SimLibs:
    """Load the simulator into this process so that NVIDIA's clients
    (pynvml, cuda.bindings) find it: the dynamic loader reuses an already
    loaded library with the same soname. `config` and `state_dir`, where
    given, become this process's (and its children's) simulated machine."""
    for name, value in ((CONFIG_ENV, config), (STATE_DIR_ENV, state_dir)):
        if value:
            os.environ[name] = str(value)
    found = libs()
    ctypes.CDLL(str(found.nvml), mode=ctypes.RTLD_GLOBAL)
    ctypes.CDLL(str(found.cuda), mode=ctypes.RTLD_GLOBAL)
    return found


def check_config(path: str | None = None) -> int:
    """Validate a simulator config with the simulator's own parser.
    Returns the GPU count or raises SimError with the parser's one-line reason."""
    lib = ctypes.CDLL(str(libs().cuda))
    fn = lib.gpusliceSimCheckConfig
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    fn.restype = ctypes.c_int
    err = ctypes.create_string_buffer(512)
    n = fn(path.encode() if path else None, err, len(err))
    if n < 0:
        raise SimError(err.value.decode(errors="replace"))
    return n

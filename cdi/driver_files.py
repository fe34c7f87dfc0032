"""Where the driver's files are on the host: its libraries (for the private
path behind the interposer), nvidia-smi, and the control device nodes.
Discovery only; composing a spec from what is found is gpuslice.cdi.generate's."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpuslice import errors, inventory, simulator
from gpuslice.host_root import HostPathError, resolve_under

log = logging.getLogger(__name__)

# the distributions' library directories, then the one GKE's and many GPU images' drivers
# are installed or mounted under (/usr/local/nvidia, with the loader told of it)
LIB_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "lib64", "usr/lib", "lib",
            "usr/local/nvidia/lib64", "usr/local/nvidia/lib")  # fmt: skip
BIN_DIRS = ("usr/bin", "usr/sbin", "usr/local/nvidia/bin")
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
# files a driver install or upgrade writes, which gpuslice-cdi.path watches
# (packaging/systemd; a unit test holds the two lists together)
WATCHED = (
    "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
    "usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
    "usr/lib/aarch64-linux-gnu/libcuda.so.1",
    "usr/lib64/libnvidia-ml.so.1",
    "usr/lib64/libcuda.so.1",
    "usr/bin/nvidia-smi",
)
# The driver's compute libraries that a CUDA program loads besides libcuda, by the name the
# loader asks for (None: the driver's version is its soname): PTX JIT (CuPy's and NVRTC's
# kernels, numba), NVVM (link-time optimisation), the compiler both use, the debugger's back end.
# A container image has none of them; nvidia-ctk's CDI spec mounts the same set. Each one the
# driver has is mounted; a driver without one (older, or a minimal install) still gets a spec.
COMPUTE_LIBS = (
    ("libnvidia-ptxjitcompiler", "libnvidia-ptxjitcompiler.so.1"),
    ("libnvidia-nvvm", "libnvidia-nvvm.so.4"),
    ("libnvidia-gpucomp", None),
    ("libcudadebugger", "libcudadebugger.so.1"),
)
# libraries every container image brings itself
BASE_LIBS = re.compile(r"^(libc|libm|libdl|libpthread|librt|ld-linux[-\w]*)\.so")


class DriverFilesError(errors.FailedPrecondition):
    pass


@dataclass(frozen=True)
class DriverFiles:
    libcuda: Path
    libnvml: Path
    extra_libs: tuple[Path, ...] = ()  # what the libraries need beyond a base image (the simulator's libyaml)
    compute_libs: tuple[tuple[str, Path], ...] = ()  # (the name the loader asks for, the host file): COMPUTE_LIBS
    nvidia_smi: Path | None = None
    control_nodes: tuple[str, ...] = ()  # container paths of /dev/nvidiactl, ... that the host has
    gpu_nodes: tuple[int, ...] = ()  # N of each /dev/nvidiaN the host has


def watched_state(root: Path) -> tuple[tuple[int, int, int] | None, ...]:
    """What the watched files are now (inode, mtime, size; None where absent): a
    driver install writes them one after another, and a change while the spec is
    made would otherwise be lost (systemd drops a path event while its unit runs)."""
    state: list[tuple[int, int, int] | None] = []
    for rel in WATCHED:
        try:
            st = (root / rel).stat()
        except OSError:
            state.append(None)
        else:
            state.append((st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(state)


def find_lib(root: Path, stem: str, version: str, soname: str | None = None) -> Path:
    """The driver library STEM.so.VERSION (else its soname, STEM.so.1 by default) under `root`,
    its links followed."""
    for d in LIB_DIRS:
        for name in (f"{stem}.so.{version}", soname or f"{stem}.so.1"):
            p = root / d / name
            if p.is_symlink() or p.exists():
                found = resolve_under(root, p)
                if found.is_file():
                    return found
    raise DriverFilesError(f"{stem}.so.{version} not found under {root} ({', '.join(LIB_DIRS)})")


def _needed(lib: Path) -> list[str]:
    """The sonames lib needs (where this process's loader would find them is not asked)."""
    out = subprocess.run(["ldd", str(lib)], capture_output=True, text=True).stdout
    return re.findall(r"^\s*(\S+) => ", out, re.M)


def _deps_beside(root: Path, libs: tuple[Path, ...]) -> tuple[Path, ...]:
    """What the driver's libraries need beyond a base image, found where the
    driver is (under `root`), not where this process's loader would look."""
    found: dict[Path, None] = {}
    for lib in libs:
        for name in _needed(lib):
            if BASE_LIBS.match(name):
                continue
            for d in (lib.parent, *(root / d for d in LIB_DIRS)):
                if (d / name).is_symlink() or (d / name).exists():
                    found[resolve_under(root, d / name)] = None
                    break
    return tuple(p for p in found if p not in libs)


def compute_libs(root: Path, driver_version: str) -> tuple[tuple[str, Path], ...]:
    """The COMPUTE_LIBS this driver has under `root`: (the name the loader asks for, the file)."""
    found = []
    for stem, soname in COMPUTE_LIBS:
        try:
            found.append((soname or f"{stem}.so.{driver_version}", find_lib(root, stem, driver_version, soname)))
        except (DriverFilesError, HostPathError) as e:  # absent, or its links loop: the spec goes without it
            log.info("%s: not in this driver (%s); containers go without it", soname or stem, e)
    return tuple(found)


def nvidia(root: Path, driver_version: str) -> DriverFiles:
    """The NVIDIA driver's files under a root (/ on a node, /host/<driver root> in
    the node agent, a fixture in tests)."""
    smi = shutil.which("nvidia-smi", path=":".join(str(root / d) for d in BIN_DIRS))
    libs = (find_lib(root, "libcuda", driver_version), find_lib(root, "libnvidia-ml", driver_version))
    compute = compute_libs(root, driver_version)
    return DriverFiles(
        libcuda=libs[0],
        libnvml=libs[1],
        extra_libs=_deps_beside(root, libs + tuple(p for _, p in compute)),
        compute_libs=compute,
        nvidia_smi=resolve_under(root, Path(smi)) if smi else None,
        control_nodes=tuple(f"/dev/{n}" for n in CONTROL_NODES if (root / "dev" / n).exists()),
        gpu_nodes=tuple(sorted(int(p.name[6:]) for p in (root / "dev").glob("nvidia*") if p.name[6:].isdigit())),
    )


def simulated() -> DriverFiles:
    """The simulated driver built with gpuslice (it has no device nodes)."""
    simulator.require()
    import gpuslice_sim

    sim = gpuslice_sim.lib_dir()
    libcuda = sim / "libcuda.so.1"
    jit = "libnvidia-ptxjitcompiler.so.1"  # its stand-in for the driver's PTX JIT compiler
    return DriverFiles(
        libcuda=libcuda,
        libnvml=sim / "libnvidia-ml.so.1",
        extra_libs=_deps_beside(Path("/"), (libcuda,)),
        compute_libs=((jit, sim / jit),) if (sim / jit).exists() else (),
    )


# a spec is made again when the driver's files changed meanwhile, at most this often
REREAD_ENV = "GPUSLICE_CDI_REREAD"
REREADS = 5
# how long a driver found incomplete (NVML there, libcuda not yet) is waited for
INCOMPLETE_WAIT_S = 30.0


class DriverWatch:
    """The one watcher of the driver's files under a root (WATCHED): what they
    were when last looked at, and whether they changed since. `gpuslice cdi
    generate` looks once around making a spec (reread_if_changed); the node
    agent looks every poll period and makes the spec again."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.seen = watched_state(root)

    def any(self) -> bool:
        """Whether any watched file was there when last looked at."""
        return any(self.seen)

    def differs(self) -> bool:
        """Whether the files are not what they were when last looked at."""
        return watched_state(self.root) != self.seen

    def changed(self) -> bool:
        """Whether the files changed since they were last looked at (looked at now)."""
        now = watched_state(self.root)
        changed, self.seen = now != self.seen, now
        return changed

    def wait(self, seconds: float) -> bool:
        """Wait up to `seconds` for them to differ, looking every 0.1 s; whether they do."""
        deadline = time.monotonic() + seconds
        while not self.differs():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True


@contextmanager
def reread_if_changed(root: Path, watch: bool) -> Iterator[None]:
    """Around making a spec from the driver under `root`: when its files
    changed meanwhile (an install in progress), this process starts again
    (execv, the same argv), so that it reads them with the new driver's NVML;
    at most REREADS times in a row. A driver found incomplete is an install
    in progress too: its next file is waited for (INCOMPLETE_WAIT_S), since
    systemd drops the path event of a file that lands while this unit runs.
    Incomplete either way round: NVML there and libcuda not (DriverFilesError),
    or a watched file there and NVML not loadable yet (NoDriver). No driver
    file at all is no install in progress: nothing is waited for."""
    watch_ = DriverWatch(root) if watch else None
    try:
        yield
    except (DriverFilesError, inventory.NoDriver):
        if watch_ is not None and watch_.any():
            log.warning("the driver's files are incomplete; waiting up to %.0f s for the rest", INCOMPLETE_WAIT_S)
            watch_.wait(INCOMPLETE_WAIT_S)
        raise
    finally:
        rounds = int(os.environ.get(REREAD_ENV, "0"))
        if watch_ is not None and rounds < REREADS and watch_.changed():
            log.warning("the driver's files changed while they were read; reading them again")
            os.environ[REREAD_ENV] = str(rounds + 1)
            os.execv(sys.executable, sys.orig_argv)

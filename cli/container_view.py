"""A container's view of the driver, made in a pid namespace's own mount
namespace (cli/pid_namespace.py) for `gpuslice selftest` and the real-GPU
kit: what the CDI spec mounts is mounted where the spec says (under the view's
root, as the layout's environment names it), and the host's own driver files
are hidden. A probe then finds only what a container would: on the host the
loader's cache and path find every driver library, and a library the spec
forgets (the PTX JIT compiler, say) would not be noticed."""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpuslice.cdi import driver_files
from gpuslice.cli.pid_namespace import PidNamespace

# the NVIDIA driver's libraries by name (its compute, graphics and video parts): hidden on the host
DRIVER_LIB = re.compile(
    r"^(libcuda|libnvidia-|libcudadebugger|libnvcuvid|libnvoptix|lib(GLX|EGL|GLESv1_CM|GLESv2)_nvidia|libvdpau_nvidia)"
    r"[^/]*\.so"
)


@dataclass(frozen=True)
class View:
    root: Path  # where the container's paths are, in the namespace
    mounts: tuple[tuple[str, str], ...] = ()  # (host path, container path): the spec's mounts
    hide_files: tuple[str, ...] = ()  # the host's driver files, masked
    hide_dirs: tuple[str, ...] = ()  # directories that hold nothing but the driver (the simulator's)


def host_driver(
    files: driver_files.DriverFiles, simulated: bool, root: Path = Path("/")
) -> tuple[list[str], list[str]]:
    """(files, directories) of the driver on this host, to hide: the simulator's own directory;
    a real driver's libraries wherever the loader would look (the distributions' directories,
    /usr/local/nvidia), each once, by its real path."""
    if simulated:
        return [], [str(files.libcuda.resolve().parent)]
    found: dict[str, None] = {}
    for d in driver_files.LIB_DIRS:
        where = root / d
        if not where.is_dir() or where.is_symlink():  # /lib -> usr/lib: seen once, as itself
            continue
        for p in where.iterdir():
            if DRIVER_LIB.match(p.name) and p.exists():
                found[str(p.resolve())] = None
    return sorted(found), []


def script(view: View) -> str:
    """The shell commands that make the view (run inside the mount namespace, as root)."""
    q = shlex.quote
    lines = ["set -e", f"mount -t tmpfs -o mode=0755 gpuslice-view {q(str(view.root))}"]
    for host, target in view.mounts:
        at = view.root / target.lstrip("/")
        if Path(host).is_dir():
            lines.append(f"mkdir -p {q(str(at))}")
        else:
            lines.append(f"mkdir -p {q(str(at.parent))} && : > {q(str(at))}")
        lines.append(f"mount --bind {q(host)} {q(str(at))}")
    # after the binds above, which hold the files themselves: masking the host's paths leaves them
    lines += [f"mount --bind /dev/null {q(f)}" for f in view.hide_files]
    lines += [f"mount -t tmpfs -o ro,mode=0755 gpuslice-hidden {q(d)}" for d in view.hide_dirs]
    return "\n".join(lines)


def enter(ns: PidNamespace, view: View) -> None:
    """Make the view in the namespace; one error line naming the step that failed otherwise."""
    r = subprocess.run(ns.command(["sh", "-c", script(view)], cwd="/"), capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise OSError(f"the container view under {view.root}: {(r.stderr.strip() or 'failed').splitlines()[-1]}")

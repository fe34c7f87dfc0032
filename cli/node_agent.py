"""`gpuslice node-agent`: gpuslice installed onto a node from its container
image (the chart's DaemonSet), as NVIDIA's toolkit container installs itself.

1. The node's parts go under one host directory: the hook, the runtime shim
   and the interposer (the runtime runs them on the host, outside any image).
2. The driver is found under the host's root (or `--driver-root`, where a
   driver container keeps it); its NVML is loaded from there, and the CDI spec
   naming the host's paths goes to /var/run/cdi, made again when the driver's
   files change.
3. The daemon runs in this process, its sockets in /run/gpuslice and its
   store in /var/lib/gpuslice, both the host's: the hook and the shim reach it
   there, and the slices outlive the agent (an upgrade keeps them).
4. The runtime is configured with `gpuslice install containerd|crio` against
   the host's root, and restarted through the host's systemd.

The daemon runs here, not as a host unit: managed node images (Bottlerocket,
COS, the EKS and GKE images) have no Python of ours, and the image carries it.

On SIGTERM (uninstall, upgrade) it undoes exactly what it did: the runtime's
files as install found them, the runtime restarted, then every file it wrote
back as it was (cli/host_files.py). The slice store stays."""

from __future__ import annotations

import ctypes
import logging
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from gpuslice import constants, errors, inventory, paths, stop_signals
from gpuslice.allocator.config import Config
from gpuslice.allocator.daemon import Daemon
from gpuslice.cdi import driver_files
from gpuslice.cdi import generate as gen
from gpuslice.cdi import spec as cdi_spec
from gpuslice.cli import install
from gpuslice.cli.host_files import HostFiles
from gpuslice.cli.node_agent_options import RUN_DIR, Options

log = logging.getLogger(__name__)

RECORD = "node-agent.json"  # in the state directory: what the agent wrote on the host
RUNTIME_BIN_DIRS = ("usr/local/bin", "usr/bin", "bin")
# the binaries the runtime runs, and the interposer the spec mounts (host_dir/bin, host_dir/wrap)
EXECUTABLES = ("gpuslice-hook", "gpuslice-runtime")


class AgentError(errors.FailedPrecondition):
    """The host is not one the agent can install onto (one line: what and why)."""


def parts() -> list[tuple[Path, str, int]]:
    """(source in this image, path under host_dir, mode) of each part the host needs."""
    found = [(paths.executable(n), f"bin/{n}", 0o755) for n in EXECUTABLES]
    found += [(paths.native_dir() / "wrap" / n, f"wrap/{n}", 0o755) for n in gen.INTERPOSER]
    for src, _, _ in found:
        if not src.is_file():
            raise AgentError(f"{src}: missing from this image; accepted: the gpuslice image the chart names")
    return found


def load_nvml(opts: Options) -> inventory.Inventory:
    """The host driver's NVML loaded by its path (pynvml then finds it by its
    soname), and the GPUs read through it."""
    root = opts.here(opts.driver_root, "driver root")
    lib = driver_files.find_lib(root, "libnvidia-ml", "1")
    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    return inventory.read()


def restart_command(runtime: str) -> list[str]:
    """The host's systemd restarts the runtime's unit (the pod shares the host's
    pids: pid 1 is the host's init, and its mount namespace has systemctl)."""
    return ["nsenter", "--target", "1", "--mount", "--", "systemctl", "restart", f"{runtime}.service"]


class NodeAgent:
    def __init__(self, opts: Options, run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> None:
        if opts.runtime not in (*install.TARGETS, "none") or opts.runtime in ("podman", "docker"):
            raise AgentError(
                f"--runtime {opts.runtime}: not one the agent configures; accepted: containerd, crio, none"
            )
        self.opts = opts
        self.run = run  # how a host command runs (tests record it)
        self.files = HostFiles(opts.state_dir / RECORD)
        self.spec_path = opts.cdi_dir / gen.SPEC_NAME
        self.stopping = threading.Event()
        self.runtime_configured = False
        self.daemon: Daemon | None = None

    # ---- 1. the node's parts ----------------------------------------------------

    def install_parts(self) -> None:
        base = self.opts.here(self.opts.host_dir, "host directory")
        for src, rel, mode in parts():
            if self.files.put(base / rel, src.read_bytes(), mode):
                log.info("wrote %s/%s", self.opts.host_dir, rel)

    # ---- 2. the CDI spec --------------------------------------------------------

    def spec_options(self) -> gen.Options:
        o, daemon = self.opts, self.daemon_config()
        return gen.Options(
            driver="nvidia",
            driver_root=Path(o.driver_root),
            hook=f"{o.host_dir}/bin/gpuslice-hook",
            daemon_socket=str(daemon.socket),
            slice_dir=str(daemon.slice_socket.parent),
            host_root=o.host_root,
            interposer_dir=f"{o.host_dir}/wrap",
        )

    def write_spec(self, inv: inventory.Inventory) -> None:
        spec = gen.generate(inv, self.spec_options())
        if self.files.put(self.spec_path, cdi_spec.render(spec).encode()):
            log.info("wrote %s: %d devices", self.spec_path, len(spec.devices))

    def watch_driver(self, inv: inventory.Inventory) -> None:
        """The spec made again when the driver's files change (an upgrade)."""
        watch = driver_files.DriverWatch(self.opts.here(self.opts.driver_root, "driver root"))
        while not self.stopping.wait(self.opts.driver_poll):
            if not watch.changed():
                continue
            try:
                self.write_spec(inv)
            except errors.GpusliceError as e:
                log.error("the driver's files changed, and no spec could be made: %s", e)

    # ---- 3. the runtime ---------------------------------------------------------

    def _runtime_binary(self) -> str:
        for d in RUNTIME_BIN_DIRS:
            p = self.opts.host_root / d / self.opts.runtime
            if p.is_symlink() or p.exists():
                return str(driver_files.resolve_under(self.opts.host_root, p))
        return ""

    def _context(self, remove: bool) -> install.Context:
        o = self.opts
        return install.Context(
            root=o.host_root,
            shim=f"{o.host_dir}/bin/gpuslice-runtime",
            hook=f"{o.host_dir}/bin/gpuslice-hook",
            remove=remove,
            binary="" if remove or o.runtime_version else self._runtime_binary(),
            version=o.runtime_version,
            config=o.here(o.runtime_config, "runtime config") if o.runtime_config else None,
            manifest_dir=o.state_dir / "install",
        )

    def configure_runtime(self, remove: bool = False) -> None:
        if self.opts.runtime == "none":
            return
        ctx = self._context(remove)
        self.files.adopt(install.record_path(ctx, self.opts.runtime))  # what an agent before this recorder kept
        changes = install.plan(self.opts.runtime, ctx, self.files)
        changed = [c for c in changes if c.changes]
        install.apply(changes, self.files, remove)
        self.runtime_configured = not remove
        for c in changed:
            log.info("%s %s", "restored" if remove else "wrote", c.path)
        if changed:
            self.restart_runtime()

    def restart_runtime(self) -> None:
        if self.opts.runtime_restart == "none":
            log.info(
                "the runtime's configuration changed; restart %s to load it (--runtime-restart none)", self.opts.runtime
            )
            return
        cmd = restart_command(self.opts.runtime)
        r = self.run(cmd, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise AgentError(f"{' '.join(cmd)}: exit {r.returncode}: {(r.stderr or '').strip()[:200]}")
        log.info("restarted %s", self.opts.runtime)

    # ---- 4. the daemon ----------------------------------------------------------

    def daemon_config(self) -> Config:
        o = self.opts
        # the package's layout (gpuslice_constants.h), under run_dir
        return Config(
            socket=o.run_dir / Path(constants.CONTROL_SOCKET).name,
            slice_socket=o.run_dir / Path(constants.SLICE_SOCKET).relative_to(RUN_DIR),
            slice_files_dir=o.run_dir / Path(constants.SLICE_FILES_DIR).relative_to(RUN_DIR),
            state_dir=o.state_dir,
            metrics_address="0.0.0.0",  # the pod's own address, where the chart's Service looks
            metrics_port=o.metrics_port,
            compute_period=o.compute_period,
            host_root=o.host_root,
            cdi_dirs=(o.host_root / "etc/cdi", o.cdi_dir),
        )

    # ---- the whole ---------------------------------------------------------------

    def start(self) -> inventory.Inventory:
        """Installed and serving; on a failure, what was done is undone first."""
        try:
            self.install_parts()
            inv = load_nvml(self.opts)
            self.write_spec(inv)
            self.daemon = Daemon(self.daemon_config())
            self.daemon.start()  # serving before the runtime sends it the first container
            self.configure_runtime()
        except BaseException:
            self.undo()
            raise
        return inv

    def undo(self) -> None:
        """The runtime first (no container start reaches a daemon going away),
        then the daemon, then every file back as it was."""
        try:
            if self.runtime_configured:
                self.configure_runtime(remove=True)
        finally:
            if self.daemon is not None:
                self.daemon.stop()
                self.daemon = None
            kept = self.files.undo()
            log.info("undone%s", f"; left as edited since: {', '.join(kept)}" if kept else "")

    def serve(self) -> None:
        inv = self.start()
        assert self.daemon is not None
        threading.Thread(target=self.watch_driver, args=(inv,), name="driver-watch", daemon=True).start()
        stop_signals.set_on_signals(self.stopping)
        log.info("installed under %s; serving", self.opts.host_dir)
        self.stopping.wait()
        self.undo()

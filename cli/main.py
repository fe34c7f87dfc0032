"""The `gpuslice` command: the composition root, the one place that may import
every component (core, cdi, the daemon) to wire them to a command line."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import click

from gpuslice import __version__, constants, errors, paths, simulator

if TYPE_CHECKING:
    from gpuslice.cdi.generate import Options

# exit statuses (docs/daemon.md): 1 an error, 2 a bad configuration or request,
# 3 no usable NVIDIA driver (NVML cannot be loaded): systemd does not restart on it
EXIT_NO_DRIVER = 3


def _sim() -> ModuleType:
    """gpuslice-sim, or exit 2 with the one line that names the package to install."""
    try:
        simulator.require()
    except simulator.SimulatorMissing as e:
        click.echo(f"gpuslice: {e}", err=True)
        sys.exit(2)
    import gpuslice_sim

    return gpuslice_sim


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuslice")
def main() -> None:
    """gpuslice: share NVIDIA GPUs among containers with hard memory limits and compute shares."""


@main.command()
@click.option("--sim", "use_sim", is_flag=True, help="read the simulated GPUs instead of the driver's")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def gpus(use_sim: bool, as_json: bool) -> None:
    """Show the node's GPUs, memory in use and processes (through NVML)."""
    from gpuslice import inventory
    from gpuslice.cli.gpu_table import render

    if use_sim:
        _sim().activate()
    try:
        inv = inventory.read()
    except inventory.NoDriver as e:
        click.echo(f"gpuslice: {e}", err=True)
        sys.exit(EXIT_NO_DRIVER)
    if as_json:
        data = asdict(inv)
        data["topology"] = [
            {"gpus": list(k), "level": v, "nvlink": inv.nvlink.get(k, False)} for k, v in inv.topology.items()
        ]
        data.pop("nvlink")
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(render(inv))


@main.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="daemon config (YAML)")
@click.option("-v", "--verbose", is_flag=True, help="log at debug level")
def daemon(config_path: str | None, verbose: bool) -> None:
    """Run the allocator daemon (gRPC control socket, slice socket, metrics)."""
    import logging

    from gpuslice import inventory
    from gpuslice.allocator import config as daemon_config
    from gpuslice.allocator.daemon import Daemon

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="gpuslice-daemon: %(message)s")
    import pynvml

    try:
        cfg = daemon_config.load(config_path)
    except daemon_config.ConfigError as e:
        click.echo(str(e), err=True)
        sys.exit(2)
    try:
        node = Daemon(cfg)
    except inventory.NoDriver as e:
        # no restart loop: the unit does not restart on this status, and the CDI path
        # unit starts the daemon again when the driver's files appear
        click.echo(f"gpuslice daemon: {e} (nvml: {cfg.nvml})", err=True)
        sys.exit(EXIT_NO_DRIVER)
    except errors.FailedPrecondition as e:  # another daemon on this state, a damaged store
        click.echo(f"gpuslice daemon: {e}", err=True)
        sys.exit(2)
    except (pynvml.NVMLError, errors.GpusliceError) as e:
        click.echo(f"gpuslice daemon: cannot start (nvml: {cfg.nvml}): {e}", err=True)
        sys.exit(2)
    except OSError as e:
        click.echo(f"gpuslice daemon: {e.filename or ''}: {e.strerror}", err=True)
        sys.exit(2)
    try:
        node.serve()
    except OSError as e:  # a socket path it cannot make: under a regular file, no permission
        click.echo(f"gpuslice daemon: {e.filename or ''}: {e.strerror}", err=True)
        sys.exit(2)


_RUNTIME_VERSION = click.option("--runtime-version", help="the runtime's version, MAJOR.MINOR, instead of asking it")


@main.command()
@click.option("--socket", "socket_path", type=click.Path(), help="daemon socket (default $GPUSLICE_SOCKET or /run/...)")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def status(socket_path: str | None, as_json: bool) -> None:
    """GPUs and slices as the daemon sees them (nvidia-smi for slices)."""
    import grpc
    from google.protobuf.json_format import MessageToDict

    from gpuslice.cli.status_table import render_status
    from gpuslice.client import AllocatorClient

    try:
        with AllocatorClient(socket_path, timeout=5) as c:
            inv, slices = c.inventory(), c.list()
    except grpc.RpcError as e:
        raise click.ClickException(f"cannot reach the daemon: {e.details()}") from e
    if as_json:
        data = {
            "inventory": MessageToDict(inv, preserving_proto_field_name=True),
            "slices": [MessageToDict(s, preserving_proto_field_name=True) for s in slices],
        }
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(render_status(inv, slices))


@main.group("cdi")
def cdi_group() -> None:
    """CDI specs of kind gpuslice.io/gpu."""


@cdi_group.command("generate")
@click.option("--driver", type=click.Choice(["nvidia", "sim"]), default="nvidia", show_default=True)
@click.option("--driver-root", type=click.Path(file_okay=False), default="/", show_default=True)
@click.option("--output", type=click.Path(dir_okay=False), default="/var/run/cdi/gpuslice.json", show_default=True,
              help="the spec file (.json, or .yaml/.yml for YAML)")  # fmt: skip
@click.option("--hook", "hook_path", type=click.Path(dir_okay=False), help="gpuslice-hook on the host (default: PATH)")
@click.option("--daemon-socket", default=constants.CONTROL_SOCKET, show_default=True)
@click.option("--slice-dir", default=constants.SLICE_SOCKET_DIR, show_default=True, help="host dir of the slice socket")
@click.option("--sim-config", type=click.Path(dir_okay=False), help="simulator config to mount (--driver sim)")
@click.option("--sim-state-dir", type=click.Path(file_okay=False), help="simulator state to mount (--driver sim)")
@click.option("--stdout", "to_stdout", is_flag=True, help="print the spec instead of writing it")
def cdi_generate(
    driver, driver_root, output, hook_path, daemon_socket, slice_dir, sim_config, sim_state_dir, to_stdout
):
    """Discover the GPUs and the driver's files and write the CDI spec."""
    from gpuslice.cdi import driver_files
    from gpuslice.cdi import generate as gen

    if driver == "sim":
        _sim().activate(sim_config, sim_state_dir)
    hook_path = hook_path or str(paths.executable("gpuslice-hook"))
    opts = gen.Options(driver, Path(driver_root), hook_path, daemon_socket, slice_dir, sim_config, sim_state_dir)
    from gpuslice import inventory

    watch = driver == "nvidia" and not to_stdout
    try:
        # the errors reach reread_if_changed as they are: an incomplete driver is waited for there
        with driver_files.reread_if_changed(opts.driver_root, watch):
            _write_spec(opts, Path(output), to_stdout)
    except inventory.NoDriver as e:
        click.echo(f"gpuslice: {e}; no CDI spec written", err=True)
        sys.exit(EXIT_NO_DRIVER)
    except errors.GpusliceError as e:
        raise click.ClickException(str(e)) from e


def _write_spec(opts: Options, output: Path, to_stdout: bool) -> None:
    from gpuslice import inventory
    from gpuslice.cdi import generate as gen
    from gpuslice.cdi import spec as cdi_spec

    spec = gen.generate(inventory.read(), opts)
    if to_stdout:
        data = spec.to_dict()
        cdi_spec.validate(data)
        click.echo(json.dumps(data, indent=2))
    else:
        cdi_spec.write(spec, output)
        click.echo(f"wrote {output}: {len(spec.devices)} devices, cdiVersion {spec.to_dict()['cdiVersion']}")


@cdi_group.command("list")
def cdi_list() -> None:
    """The gpuslice.io/gpu devices as a CDI runtime resolves them (/var/run/cdi over /etc/cdi)."""
    from gpuslice.cdi.registry import Registry

    for name, found in sorted(Registry().devices().items(), key=lambda kv: str(kv[1].path)):
        click.echo(f"{found.spec.kind}={name}\t{found.path}")


@cdi_group.command("validate")
@click.argument("file", type=click.Path(dir_okay=False))
def cdi_validate(file: str) -> None:
    """Check a CDI spec (JSON or YAML): schema, names, and the cdiVersion its fields need."""
    from gpuslice.cdi import spec as cdi_spec

    try:
        spec = cdi_spec.load(Path(file))
    except cdi_spec.SpecError as e:
        click.echo("\n".join(f"gpuslice: {line}" for line in str(e).splitlines()), err=True)
        sys.exit(1)
    click.echo(f"ok: {spec.kind}, {len(spec.devices)} devices, cdiVersion {spec.version}")


def _install(target: str, ctx_args: dict, dry_run: bool) -> None:
    from gpuslice.cli import install as installer

    version = ctx_args.pop("runtime_version", None)
    try:
        ctx = installer.Context(
            root=Path(ctx_args.pop("root")),
            version=installer.parse_version(version) if version else None,
            **ctx_args,
        )
        if not ctx.remove:
            ctx.shim = ctx.shim or str(paths.executable("gpuslice-runtime"))
            ctx.hook = ctx.hook or str(paths.executable("gpuslice-hook"))
        changes = installer.plan(target, ctx)
    except errors.GpusliceError as e:
        raise click.ClickException(str(e)) from e
    pending = [c for c in changes if c.changes]
    if not pending:
        click.echo(f"{target}: nothing to change")
        return
    if dry_run:
        for c in pending:
            click.echo(c.diff(), nl=False)
        return
    try:
        installer.apply(changes)
    except OSError as e:
        raise click.ClickException(f"{e.filename}: {e.strerror}") from e
    for c in pending:
        click.echo(f"{'removed' if c.after is None else 'wrote'} {c.path}")


@main.command("selftest")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="the daemon's config (YAML)")
@click.option("--cdi-spec", type=click.Path(dir_okay=False), help="the spec to check (default: the one CDI resolves)")
@click.option("--memory", default="1Gi", show_default=True, help="each GPU's temporary slice")
@click.option("--seconds", type=click.FloatRange(1, 600), default=10.0, show_default=True,
              help="how long the compute shares are measured")  # fmt: skip
@click.option("--gpu", "gpus", type=click.IntRange(0), multiple=True, help="only this GPU (repeatable)")
@click.option("--no-shares", is_flag=True, help="skip the compute-share measurement")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def selftest_cmd(config_path, cdi_spec, memory, seconds, gpus, no_shares, as_json):
    """Check this node (root): the driver, the CDI spec, the daemon, then in
    temporary slices on each GPU the interposer over the driver: memory limits
    on every allocation path, the slice's view, SIGKILL, cuGetProcAddress,
    compute shares and the launch gate's cost. Exit 0 only if all pass."""
    from gpuslice.allocator import config as daemon_config
    from gpuslice.cli import selftest as st
    from gpuslice.cli.selftest_report import all_passed, render
    from gpuslice.cli.selftest_report import as_json as report_json
    from gpuslice.units import parse_bytes

    try:
        cfg = daemon_config.load(config_path)
        limit = parse_bytes(memory)
    except (errors.InvalidArgument, ValueError) as e:
        click.echo(f"gpuslice selftest: {' '.join(str(e).split())}", err=True)
        sys.exit(2)
    if limit < 256 << 20 or limit % (64 << 20):
        click.echo(f"gpuslice selftest: --memory {memory}: a multiple of 64Mi, at least 256Mi", err=True)
        sys.exit(2)
    opts = st.Options(cfg, Path(cdi_spec) if cdi_spec else None, limit, seconds, tuple(gpus), not no_shares)
    try:
        checks = st.run(opts)
    except (st.Stopped, KeyboardInterrupt) as e:
        click.echo(f"gpuslice selftest: {e or 'interrupted'}; its slices were released", err=True)
        sys.exit(1)
    click.echo(json.dumps(report_json(checks), indent=2) if as_json else render(checks))
    sys.exit(0 if all_passed(checks) else 1)


@main.command("kubelet-plugin")
@click.option("--node-name", envvar="NODE_NAME", required=True, help="this node's name (env NODE_NAME)")
@click.option("--kubeconfig", type=click.Path(dir_okay=False), help="default: the pod's in-cluster config")
@click.option("--socket", "daemon_socket", default=constants.CONTROL_SOCKET, show_default=True, help="the daemon")
@click.option("--plugin-dir", type=click.Path(file_okay=False), default="/var/lib/kubelet/plugins/gpuslice.io",
              show_default=True, help="its DRA socket and checkpoint")  # fmt: skip
@click.option("--registry-dir", type=click.Path(file_okay=False), default="/var/lib/kubelet/plugins_registry",
              show_default=True, help="the kubelet's plugin registry")  # fmt: skip
@click.option("--cdi-dir", type=click.Path(file_okay=False), default="/var/run/cdi", show_default=True)
@click.option("--cdi-spec", type=click.Path(dir_okay=False), help="the node's gpuslice.io/gpu spec (default: CDI's)")
@click.option("--resync", type=click.FloatRange(0.1, 3600), default=30.0, show_default=True,
              help="seconds between reads of the daemon's GPUs (republished when they change)")  # fmt: skip
@click.option("--sysfs", type=click.Path(file_okay=False), default="/sys", show_default=True,
              help="the host's sysfs, where each GPU's PCIe root complex is read")  # fmt: skip
@click.option("-v", "--verbose", is_flag=True, help="log at debug level")
def kubelet_plugin(node_name, kubeconfig, daemon_socket, plugin_dir, registry_dir, cdi_dir, cdi_spec, resync, sysfs,
                   verbose):  # fmt: skip
    """The DRA driver gpuslice.io on this node: publishes its GPUs as a
    ResourceSlice and prepares the claims kube-scheduler allocated on them."""
    from gpuslice.dra import plugin

    opts = plugin.Options(node_name, daemon_socket, kubeconfig, Path(plugin_dir), Path(registry_dir), Path(cdi_dir),
                          Path(cdi_spec) if cdi_spec else None, resync, Path(sysfs))  # fmt: skip
    _serve_node_component("kubelet-plugin", verbose, lambda: plugin.Plugin(opts))


def _serve_node_component(name: str, verbose: bool, make) -> None:
    """Log as `gpuslice-NAME`, build the component (one line and exit 2 if it
    cannot start), and serve it until SIGTERM or SIGINT."""
    import logging
    import signal

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format=f"gpuslice-{name}: %(message)s")
    try:
        p = make()
    except errors.GpusliceError as e:
        click.echo(f"gpuslice {name}: {e}", err=True)
        sys.exit(2)
    signal.signal(signal.SIGTERM, lambda *_: p.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: p.stopping.set())
    p.serve()


@main.command("device-plugin")
@click.option("--node-name", envvar="NODE_NAME", required=True, help="this node's name (env NODE_NAME)")
@click.option("--kubeconfig", type=click.Path(dir_okay=False), help="default: the pod's in-cluster config")
@click.option("--socket", "daemon_socket", default=constants.CONTROL_SOCKET, show_default=True, help="the daemon")
@click.option("--plugin-dir", type=click.Path(file_okay=False), default="/var/lib/kubelet/device-plugins",
              show_default=True, help="the kubelet's device-plugins directory (kubelet.sock)")  # fmt: skip
@click.option("--pod-resources", type=click.Path(dir_okay=False),
              default="/var/lib/kubelet/pod-resources/kubelet.sock", show_default=True,
              help="the kubelet's pod-resources socket")  # fmt: skip
@click.option("--reconcile", type=click.FloatRange(0.1, 3600), default=2.0, show_default=True,
              help="seconds between reconciles: a deleted pod's slice is released within this "
              "(5 s for one just made)")  # fmt: skip
@click.option("--no-api", is_flag=True, help="never read pods from the API server (multi-GPU admission is steered, "
              "not exact)")  # fmt: skip
@click.option("-v", "--verbose", is_flag=True, help="log at debug level")
def device_plugin_cmd(node_name, kubeconfig, daemon_socket, plugin_dir, pod_resources, reconcile, no_api,
                      verbose):  # fmt: skip
    """The kubelet device plugin (Kubernetes 1.30-1.35): GPU memory, cores and
    whole GPUs as extended resources kube-scheduler counts."""
    from gpuslice.device_plugin import plugin

    opts = plugin.Options(node_name, daemon_socket, kubeconfig, Path(plugin_dir), Path(pod_resources), reconcile,
                          not no_api)  # fmt: skip
    _serve_node_component("device-plugin", verbose, lambda: plugin.Plugin(opts))


@main.command("scheduler-extender")
@click.option("--listen", default="127.0.0.1:8790", show_default=True,
              help="HOST:PORT for kube-scheduler's calls (beside it in its pod: the loopback)")  # fmt: skip
@click.option("--policy", type=click.Choice(["binpack", "spread"]), default="binpack", show_default=True,
              help="binpack fills GPU nodes one by one (whole GPUs stay free); spread evens them out")  # fmt: skip
@click.option("-v", "--verbose", is_flag=True, help="log at debug level")
def scheduler_extender(listen, policy, verbose):
    """kube-scheduler's extender for the device plugin's resources: filters
    nodes by per-GPU fit, from what each node's plugin publishes, and scores
    them (docs/device-plugin.md)."""
    from gpuslice.device_plugin import extender

    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(f"{listen!r} (accepted: HOST:PORT, the port from 1 to 65535)", param_hint="--listen")

    def make() -> extender.Server:
        try:
            return extender.Server(extender.Extender(spread=policy == "spread"), host or "0.0.0.0", int(port))
        except OSError as e:
            raise errors.Unavailable(f"cannot listen on {listen}: {e.strerror}") from e

    _serve_node_component("scheduler-extender", verbose, make)


@main.command("node-agent")
@click.option("--host-root", type=click.Path(file_okay=False), default="/host", show_default=True,
              help="where the host's / is mounted in this container")  # fmt: skip
@click.option("--host-dir", default="/opt/gpuslice", show_default=True, help="host directory for the node's parts")
@click.option("--driver-root", default="/", show_default=True,
              help="where the NVIDIA driver is on the host (/run/nvidia/driver under a driver container)")  # fmt: skip
@click.option("--runtime", type=click.Choice(["containerd", "crio", "none"]), default="containerd", show_default=True,
              help="the runtime to configure (none: leave it as it is)")  # fmt: skip
@click.option("--runtime-restart", type=click.Choice(["systemd", "none"]), default="systemd", show_default=True,
              help="how the runtime loads its new configuration")  # fmt: skip
@click.option("--runtime-config", default="", help="containerd's config.toml on the host, where not in /etc/containerd")
@_RUNTIME_VERSION
@click.option("--run-dir", type=click.Path(file_okay=False), default=str(Path(constants.CONTROL_SOCKET).parent),
              show_default=True, help="the daemon's sockets, the host's directory mounted here at the same path "
              "(the runtime shim looks in the default)")  # fmt: skip
@click.option("--state-dir", type=click.Path(file_okay=False), default=constants.STATE_DIR, show_default=True,
              help="the host's state directory, mounted here at the same path")  # fmt: skip
@click.option("--cdi-dir", type=click.Path(file_okay=False), default="/var/run/cdi", show_default=True,
              help="the host's CDI spec directory, mounted here")  # fmt: skip
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=9445, show_default=True, help="0: none")
@click.option("--compute-period", type=click.FloatRange(0.01, 5), default=0.05, show_default=True,
              help="seconds between launch-budget refills")  # fmt: skip
@click.option("--driver-poll", type=click.FloatRange(0.1, 3600), default=10.0, show_default=True,
              help="seconds between looks at the driver's files (the spec is made again when they change)")  # fmt: skip
@click.option("-v", "--verbose", is_flag=True, help="log at debug level")
def node_agent_cmd(host_root, host_dir, driver_root, runtime, runtime_restart, runtime_config, runtime_version,
                   run_dir, state_dir, cdi_dir, metrics_port, compute_period, driver_poll, verbose):  # fmt: skip
    """Install gpuslice onto this node from its image and run the daemon; on
    SIGTERM, undo exactly that (the chart's node agent, docs/cluster-install.md)."""
    import logging

    import pynvml

    from gpuslice import inventory
    from gpuslice.cli import install as installer
    from gpuslice.cli import node_agent

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="gpuslice-node-agent: %(message)s")
    try:
        opts = node_agent.Options(
            Path(host_root), host_dir, driver_root, runtime, runtime_restart, runtime_config,
            installer.parse_version(runtime_version) if runtime_version else None, Path(run_dir), Path(state_dir),
            Path(cdi_dir),
            metrics_port, compute_period, driver_poll,
        )  # fmt: skip
        node_agent.NodeAgent(opts).serve()
    except inventory.NoDriver as e:
        click.echo(f"gpuslice node-agent: {e} (driver root {driver_root}); nothing left installed", err=True)
        sys.exit(EXIT_NO_DRIVER)
    except (errors.GpusliceError, pynvml.NVMLError) as e:
        click.echo(f"gpuslice node-agent: {e}; nothing left installed", err=True)
        sys.exit(2)
    except OSError as e:
        click.echo(f"gpuslice node-agent: {e.filename or ''}: {e.strerror}; nothing left installed", err=True)
        sys.exit(2)


_TARGETS = click.Choice(["containerd", "crio", "podman", "docker"])
_RUNTIME_BINARY = click.option(
    "--runtime-binary", "binary", default="", help="the runtime to ask its version (default: containerd, dockerd)"
)


@main.command("install")
@click.argument("target", type=_TARGETS)
@click.option("--root", default="/", show_default=True, help="filesystem root to configure")
@click.option("--shim", default="", help="gpuslice-runtime path (default: PATH)")
@click.option("--hook", default="", help="gpuslice-hook path (default: PATH)")
@_RUNTIME_BINARY
@_RUNTIME_VERSION
@click.option("--dry-run", is_flag=True, help="print the change, write nothing")
def install_cmd(target: str, dry_run: bool, **ctx_args: str) -> None:
    """Configure a container runtime to use gpuslice, for its version (idempotent)."""
    _install(target, ctx_args, dry_run)


@main.command("uninstall")
@click.argument("target", type=_TARGETS)
@click.option("--root", default="/", show_default=True, help="filesystem root to configure")
@click.option("--dry-run", is_flag=True, help="print the change, write nothing")
def uninstall_cmd(target: str, dry_run: bool, **ctx_args: object) -> None:
    """Undo `gpuslice install TARGET`: each file back as it was, unless edited since."""
    _install(target, {**ctx_args, "remove": True}, dry_run)


@main.group("sim")
def sim_group() -> None:
    """The simulated NVIDIA driver (for tests and the demo)."""


@sim_group.command("check")
@click.argument("config", required=False, type=click.Path(dir_okay=False))
def sim_check(config: str | None) -> None:
    """Validate a simulator config (default: $GPUSLICE_SIM_CONFIG or the bundled one)."""
    sim = _sim()
    try:
        n = sim.check_config(config)
    except sim.SimError as e:
        click.echo(f"gpuslice: {e}", err=True)
        sys.exit(2)
    click.echo(f"ok: {n} GPU{'s' if n != 1 else ''}")


@sim_group.command("env")
@click.option("--config", type=click.Path(dir_okay=False), help="simulator config file")
@click.option("--state-dir", type=click.Path(file_okay=False), help="shared state directory")
def sim_env(config: str | None, state_dir: str | None) -> None:
    """Print shell exports that make programs use the simulated driver."""
    for key, value in _sim().environment(config, state_dir).items():
        click.echo(f"export {key}={value}")


@sim_group.command("run", context_settings={"ignore_unknown_options": True})
@click.option("--config", type=click.Path(dir_okay=False), help="simulator config file")
@click.option("--state-dir", type=click.Path(file_okay=False), help="shared state directory")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def sim_run(config: str | None, state_dir: str | None, command: tuple[str, ...]) -> None:
    """Run COMMAND with the simulated driver as its libcuda and NVML."""
    sim = _sim()
    try:
        sim.libs()
    except sim.SimError as e:
        raise click.ClickException(str(e)) from e
    os.environ.update(sim.environment(config, state_dir))
    try:
        os.execvp(command[0], list(command))
    except OSError as e:
        raise click.ClickException(f"cannot run {command[0]}: {e.strerror}") from e


@main.command()
@click.option(
    "--mode",
    type=click.Choice(["auto", "containers", "processes"]),
    default="auto",
    show_default=True,
    help="containers (root, Podman or containerd) or plain processes; auto picks containers when it can",
)
@click.option("--workers", default=2, show_default=True, help="processes sharing GPU 0")
@click.option("--alloc-mib", default=4096, show_default=True, help="device memory each process allocates")
@click.option("--seconds", default=3.0, show_default=True, help="how long each process launches kernels")
@click.option("--config", type=click.Path(dir_okay=False), help="simulator config file")
def demo(mode: str, workers: int, alloc_mib: int, seconds: float, config: str | None) -> None:
    """Containers (or processes) sharing a simulated GPU, each held to its slice."""
    from gpuslice.cli import container_demo
    from gpuslice.cli import process_demo as demo_mod

    _sim()
    why = container_demo.available()
    if mode == "containers" or (mode == "auto" and why is None):
        try:
            container_demo.run(echo=click.echo)
        except (container_demo.DemoUnavailable, RuntimeError) as e:
            raise click.ClickException(str(e)) from e
        return
    if mode == "auto":
        click.echo(f"(container demo unavailable: {why}; running processes instead)")
    try:
        demo_mod.run(workers, alloc_mib, seconds, config, echo=click.echo)
    except (RuntimeError, errors.GpusliceError) as e:  # gpuslice-sim's SimError is a RuntimeError
        raise click.ClickException(str(e)) from e


if __name__ == "__main__":
    main()

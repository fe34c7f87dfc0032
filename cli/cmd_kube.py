"""The node's Kubernetes components: the DRA kubelet plugin, the device
plugin, the scheduler extender and the chart's node agent. Each option's
default is its component's (the Options types)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from gpuslice import errors
from gpuslice.admission.options import MODES as ADMISSION_MODES
from gpuslice.admission.options import WebhookOptions
from gpuslice.cli import app
from gpuslice.cli.node_agent_options import RESTARTS, RUNTIMES
from gpuslice.cli.node_agent_options import Options as AgentOptions
from gpuslice.device_plugin.options import ExtenderOptions
from gpuslice.device_plugin.options import Options as DevicePluginOptions
from gpuslice.dra.options import Options as DraOptions

_DRA, _DP, _EXT, _AGENT = DraOptions(""), DevicePluginOptions(""), ExtenderOptions(), AgentOptions()
_HOOK = WebhookOptions()
NODE_NAME = click.option(
    "--node-name", "node", envvar="NODE_NAME", required=True, help="this node's name (env NODE_NAME)"
)
KUBECONFIG = click.option("--kubeconfig", type=click.Path(dir_okay=False), help="default: the pod's in-cluster config")
VERBOSE = click.option("-v", "--verbose", is_flag=True, help="log at debug level")
RUNTIME_VERSION = click.option("--runtime-version", help="the runtime's version, MAJOR.MINOR, instead of asking it")


@app.command("kubelet-plugin")
@NODE_NAME
@KUBECONFIG
@click.option("--socket", "daemon_socket", default=_DRA.daemon_socket, show_default=True, help="the daemon")
@click.option(
    "--plugin-dir",
    type=click.Path(file_okay=False),
    default=str(_DRA.plugin_dir),
    show_default=True,
    help="its DRA socket and checkpoint",
)
@click.option(
    "--registry-dir",
    type=click.Path(file_okay=False),
    default=str(_DRA.registry_dir),
    show_default=True,
    help="the kubelet's plugin registry",
)
@click.option("--cdi-dir", type=click.Path(file_okay=False), default=str(_DRA.cdi_dir), show_default=True)
@click.option(
    "--cdi-spec", "base_spec", type=click.Path(dir_okay=False), help="the node's gpuslice.io/gpu spec (default: CDI's)"
)
@click.option(
    "--resync",
    "republish_s",
    type=click.FloatRange(0.1, 3600),
    default=_DRA.republish_s,
    show_default=True,
    help="seconds between reads of the daemon's GPUs (republished on a change)",
)
@click.option(
    "--sysfs",
    type=click.Path(file_okay=False),
    default=str(_DRA.sysfs),
    show_default=True,
    help="the host's sysfs, where each GPU's PCIe root complex is read",
)
@VERBOSE
def kubelet_plugin(verbose: bool, **options: object) -> None:
    """The DRA driver gpuslice.io on this node: publishes its GPUs as a
    ResourceSlice and prepares the claims kube-scheduler allocated on them."""
    from gpuslice.dra import plugin

    opts = DraOptions(**_paths(options, "plugin_dir", "registry_dir", "cdi_dir", "base_spec", "sysfs"))  # type: ignore[arg-type]
    app.log_as("kubelet-plugin", verbose)
    app.serve(lambda: plugin.Plugin(opts))


def _paths(options: dict[str, object], *names: str) -> dict[str, object]:
    """The options, those named as Paths (None stays None)."""
    return {k: Path(str(v)) if k in names and v is not None else v for k, v in options.items()}


@app.command("device-plugin")
@NODE_NAME
@KUBECONFIG
@click.option("--socket", "daemon_socket", default=_DP.daemon_socket, show_default=True, help="the daemon")
@click.option(
    "--plugin-dir",
    type=click.Path(file_okay=False),
    default=str(_DP.plugin_dir),
    show_default=True,
    help="the kubelet's device-plugins directory (kubelet.sock)",
)
@click.option(
    "--pod-resources",
    type=click.Path(dir_okay=False),
    default=str(_DP.pod_resources),
    show_default=True,
    help="the kubelet's pod-resources socket",
)
@click.option(
    "--reconcile",
    "reconcile_s",
    type=click.FloatRange(0.1, 3600),
    default=_DP.reconcile_s,
    show_default=True,
    help="seconds between reconciles: a deleted pod's slice is released within this (5 s for one just made)",
)
@click.option(
    "--no-api", is_flag=True, help="never read pods from the API server (multi-GPU admission is steered, not exact)"
)
@click.option(
    "--sysfs",
    type=click.Path(file_okay=False),
    default=str(_DP.sysfs),
    show_default=True,
    help="the host's sysfs, where each GPU's NUMA node is read (the topology of its whole-GPU unit)",
)
@VERBOSE
def device_plugin_cmd(no_api: bool, verbose: bool, **options: object) -> None:
    """The kubelet device plugin (Kubernetes 1.30-1.35): GPU memory, cores and
    whole GPUs as extended resources kube-scheduler counts."""
    from gpuslice.device_plugin import plugin

    opts = DevicePluginOptions(**_paths(options, "plugin_dir", "pod_resources", "sysfs"), use_api=not no_api)  # type: ignore[arg-type]
    app.log_as("device-plugin", verbose)
    app.serve(lambda: plugin.Plugin(opts))


@app.command("scheduler-extender")
@click.option(
    "--listen",
    default=_EXT.listen,
    show_default=True,
    help="HOST:PORT for kube-scheduler's calls (beside it in its pod: the loopback)",
)
@click.option(
    "--policy",
    type=click.Choice(["binpack", "spread"]),
    default=_EXT.policy,
    show_default=True,
    help="binpack fills GPU nodes one by one (whole GPUs stay free); spread evens them out",
)
@VERBOSE
def scheduler_extender(listen: str, policy: str, verbose: bool) -> None:
    """kube-scheduler's extender for the device plugin's resources: filters
    nodes by per-GPU fit, from what each node's plugin publishes, and scores
    them (docs/device-plugin.md)."""
    from gpuslice.device_plugin import extender

    host, port = _host_port(listen)

    def make() -> extender.Server:
        try:
            return extender.Server(extender.Extender(spread=policy == "spread"), host, port)
        except OSError as e:
            raise errors.Unavailable(f"cannot listen on {listen}: {e.strerror}") from e

    app.log_as("scheduler-extender", verbose)
    app.serve(make)


@app.command("node-agent")
@click.option(
    "--host-root",
    type=click.Path(file_okay=False),
    default=str(_AGENT.host_root),
    show_default=True,
    help="where the host's / is mounted in this container",
)
@click.option("--host-dir", default=_AGENT.host_dir, show_default=True, help="host directory for the node's parts")
@click.option(
    "--driver-root",
    default=_AGENT.driver_root,
    show_default=True,
    help="where the NVIDIA driver is on the host (/run/nvidia/driver under a driver container)",
)
@click.option(
    "--runtime",
    type=click.Choice(RUNTIMES),
    default=_AGENT.runtime,
    show_default=True,
    help="the runtime to configure (none: leave it as it is)",
)
@click.option(
    "--runtime-restart",
    type=click.Choice(RESTARTS),
    default=_AGENT.runtime_restart,
    show_default=True,
    help="how the runtime loads its new configuration",
)
@click.option(
    "--runtime-config",
    default=_AGENT.runtime_config,
    help="containerd's config.toml on the host, where not in /etc/containerd",
)
@RUNTIME_VERSION
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False),
    default=str(_AGENT.run_dir),
    show_default=True,
    help="the daemon's sockets, the host's directory mounted here at the same path "
    "(the runtime shim looks in the default)",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False),
    default=str(_AGENT.state_dir),
    show_default=True,
    help="the host's state directory, mounted here at the same path",
)
@click.option(
    "--cdi-dir",
    type=click.Path(file_okay=False),
    default=str(_AGENT.cdi_dir),
    show_default=True,
    help="the host's CDI spec directory, mounted here",
)
@click.option(
    "--metrics-port", type=click.IntRange(0, 65535), default=_AGENT.metrics_port, show_default=True, help="0: none"
)
@click.option(
    "--compute-period",
    type=click.FloatRange(0.01, 5),
    default=_AGENT.compute_period,
    show_default=True,
    help="seconds between launch-budget refills",
)
@click.option(
    "--driver-poll",
    type=click.FloatRange(0.1, 3600),
    default=_AGENT.driver_poll,
    show_default=True,
    help="seconds between looks at the driver's files (the spec is made again when they change)",
)
@VERBOSE
def node_agent_cmd(runtime_version: str | None, verbose: bool, **options: object) -> None:
    """Install gpuslice onto this node from its image and run the daemon; on
    SIGTERM, undo exactly that (the chart's node agent, docs/cluster-install.md)."""
    from gpuslice import inventory
    from gpuslice.cli import install as installer
    from gpuslice.cli import node_agent

    app.log_as("node-agent", verbose)
    app.after_failure("; nothing left installed")
    version = installer.parse_version(runtime_version) if runtime_version else None
    opts = AgentOptions(**_paths(options, "host_root", "run_dir", "state_dir", "cdi_dir"), runtime_version=version)  # type: ignore[arg-type]
    try:
        node_agent.NodeAgent(opts).serve()
    except inventory.NoDriver as e:
        raise inventory.NoDriver(f"{e} (driver root {opts.driver_root})") from e


def _host_port(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(f"{listen!r} (accepted: HOST:PORT, the port from 1 to 65535)", param_hint="--listen")
    return host or "0.0.0.0", int(port)


@app.command("admission-webhook")
@click.option("--listen", default=_HOOK.listen, show_default=True, help="HOST:PORT the API server calls")
@click.option(
    "--mode",
    type=click.Choice(ADMISSION_MODES),
    default=_HOOK.mode,
    show_default=True,
    help="how a rewritten pod asks gpuslice: the chart's mode",
)
@click.option("--tls-cert", type=click.Path(dir_okay=False), default=str(_HOOK.tls_cert), show_default=True)
@click.option("--tls-key", type=click.Path(dir_okay=False), default=str(_HOOK.tls_key), show_default=True)
@click.option("--resource-name", default=_HOOK.resource_name, show_default=True, help="HAMi's vGPU count")
@click.option("--resource-mem", default=_HOOK.resource_mem, show_default=True, help="HAMi's memory per vGPU (MiB)")
@click.option(
    "--resource-mem-percentage",
    default=_HOOK.resource_mem_percentage,
    show_default=True,
    help="HAMi's memory per vGPU as a percentage",
)
@click.option("--resource-cores", default=_HOOK.resource_cores, show_default=True, help="HAMi's cores (percent)")
@click.option("--resource-priority", default=_HOOK.resource_priority, show_default=True, help="HAMi's priority")
@click.option(
    "--largest-gpu-memory",
    type=click.IntRange(0, 1 << 24),
    default=_HOOK.largest_gpu_memory,
    show_default=True,
    help="MiB: a vGPU asking more is refused at admission (0: the largest the device plugins publish, if any)",
)
@click.option(
    "--no-api",
    is_flag=True,
    help="never call the API server: no Nodes read (sizes are checked against "
    "--largest-gpu-memory alone), and in mode dra no template written (its pods are refused)",
)
@KUBECONFIG
@click.option(
    "--templates-owner",
    default=_HOOK.templates_owner,
    help="mode dra: the MutatingWebhookConfiguration (its name) named as the owner of each template written, "
    "so that they are deleted with it (the chart's: gpuslice-admission)",
)
@click.option(
    "--scheduler-name",
    "scheduler_names",
    multiple=True,
    default=_HOOK.scheduler_names,
    help="FROM=TO: a rewritten pod's schedulerName FROM (HAMi's) becomes TO (repeatable)",
)
@VERBOSE
def admission_webhook(
    verbose: bool, scheduler_names: tuple[str, ...], largest_gpu_memory: int, no_api: bool, **options: str
) -> None:
    """A mutating admission webhook: pods written for HAMi or Volcano's vGPU
    are rewritten to ask gpuslice for the same (docs/migrate-from-hami.md)."""
    from gpuslice.admission import largest
    from gpuslice.admission.review import Settings
    from gpuslice.admission.server import Server
    from gpuslice.admission.templates import TemplateWriter

    given = WebhookOptions(**options)  # type: ignore[arg-type]
    opts = dataclasses.replace(given, tls_cert=Path(given.tls_cert), tls_key=Path(given.tls_key),
                               scheduler_names=scheduler_names, largest_gpu_memory=largest_gpu_memory,
                               use_api=not no_api)  # fmt: skip
    host, port = _host_port(opts.listen)
    schedulers = opts.schedulers()
    app.log_as("admission-webhook", verbose)

    def make() -> Server:
        # the device plugins publish each GPU's size: read where nothing is configured
        read = opts.use_api and opts.mode == "devicePlugin" and not opts.largest_gpu_memory
        sizes = largest.LargestGpu(opts.largest_gpu_memory, largest.node_lister(opts.kubeconfig) if read else None)
        # mode dra: each rewritten pod's ResourceClaimTemplates are written into its namespace
        writer = (TemplateWriter(opts.kubeconfig, owner=opts.templates_owner)
                  if opts.use_api and opts.mode == "dra" else None)  # fmt: skip
        settings = Settings(opts.mode, opts.names(), schedulers, sizes.start().mib, writer)
        return Server(settings, host, port, opts.tls_cert, opts.tls_key)

    app.serve(make)

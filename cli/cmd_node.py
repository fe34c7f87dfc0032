"""Commands on this node: its GPUs, the daemon, its status, the selftest, the demo."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import click

from gpuslice import errors
from gpuslice.cli import app


@app.command()
@click.option("--sim", "use_sim", is_flag=True, help="read the simulated GPUs instead of the driver's")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def gpus(use_sim: bool, as_json: bool) -> None:
    """Show the node's GPUs, memory in use and processes (through NVML)."""
    from gpuslice import inventory
    from gpuslice.cli.gpu_table import render

    if use_sim:
        app.sim().activate()
    inv = inventory.read()
    if as_json:
        data = asdict(inv)
        data["topology"] = [
            {"gpus": list(k), "level": v, "nvlink": inv.nvlink.get(k, False)} for k, v in inv.topology.items()
        ]
        data.pop("nvlink")
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(render(inv))


@app.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="daemon config (YAML)")
@click.option("-v", "--verbose", is_flag=True, help="log at debug level")
def daemon(config_path: str | None, verbose: bool) -> None:
    """Run the allocator daemon (gRPC control socket, slice socket, metrics)."""
    from gpuslice.allocator import config as daemon_config
    from gpuslice.allocator.daemon import Daemon

    app.log_as("daemon", verbose)
    cfg = daemon_config.load(config_path)
    # without a driver: exit 3, on which the unit does not restart; the CDI path unit
    # starts the daemon again when the driver's files appear
    app.after_failure(f" (nvml: {cfg.nvml})")
    node = Daemon(cfg)
    app.after_failure("")
    node.serve()


@app.command()
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
        raise errors.Unavailable(f"cannot reach the daemon: {e.details()}") from e
    if as_json:
        data = {
            "inventory": MessageToDict(inv, preserving_proto_field_name=True),
            "slices": [MessageToDict(s, preserving_proto_field_name=True) for s in slices],
        }
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(render_status(inv, slices))


@app.command()
@click.argument("container")
@click.option("--memory", help="the new memory limit per GPU (as gpuslice.io/memory: 8Gi, 1500Mi)")
@click.option("--cores", help="the new compute share, 1-100 percent of each GPU (as gpuslice.io/cores)")
@click.option("--socket", "socket_path", type=click.Path(), help="daemon socket (default $GPUSLICE_SOCKET or /run/...)")
@click.option("--json", "as_json", is_flag=True, help="print the resized slice as JSON")
def resize(container: str, memory: str | None, cores: str | None, socket_path: str | None, as_json: bool) -> None:
    """Change a running container's slice: its memory limit and/or its compute
    share, on the GPUs it has, when they fit (CONTAINER: its ID, a unique start
    of one, or the slice's ID). Its processes see the new limits at once; a
    memory limit below what they hold is refused."""
    from google.protobuf.json_format import MessageToDict

    from gpuslice import request
    from gpuslice.cli.slice_lookup import find
    from gpuslice.cli.status_table import render_status
    from gpuslice.client import AllocatorClient

    asked = {k: v for k, v in ((request.MEMORY, memory), (request.CORES, cores)) if v is not None}
    if not asked:
        raise errors.InvalidArgument("nothing to change; accepted: --memory SIZE and/or --cores PERCENT")
    try:
        with AllocatorClient(socket_path, timeout=10) as c:
            target = find(c.list(), container)
            resized = c.resize(target.container_id, asked)
            inv = c.inventory()
    except errors.Unavailable as e:
        raise errors.Unavailable(f"cannot reach the daemon: {e}") from e
    if as_json:
        click.echo(json.dumps(MessageToDict(resized, preserving_proto_field_name=True), indent=2))
    else:
        click.echo(render_status(inv, [resized]))


@app.command("selftest")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="the daemon's config (YAML)")
@click.option("--cdi-spec", type=click.Path(dir_okay=False), help="the spec to check (default: the one CDI resolves)")
@click.option("--memory", default="1Gi", show_default=True, help="each GPU's temporary slice")
@click.option(
    "--seconds",
    type=click.FloatRange(1, 600),
    default=10.0,
    show_default=True,
    help="how long the compute shares are measured",
)
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
    except (errors.InvalidArgument, ValueError) as e:  # one line, whatever the config's problems
        raise errors.InvalidArgument(" ".join(str(e).split())) from e
    if limit < 256 << 20 or limit % (64 << 20):
        raise errors.InvalidArgument(f"--memory {memory}: a multiple of 64Mi, at least 256Mi")
    opts = st.Options(cfg, Path(cdi_spec) if cdi_spec else None, limit, seconds, tuple(gpus), not no_shares)
    try:
        checks = st.run(opts)
    except (st.Stopped, KeyboardInterrupt) as e:
        app.fail(f"gpuslice selftest: {e or 'interrupted'}; its slices were released")
    click.echo(json.dumps(report_json(checks), indent=2) if as_json else render(checks))
    sys.exit(0 if all_passed(checks) else 1)


@app.command()
@click.option(
    "--mode",
    type=click.Choice(["auto", "containers", "processes"]),
    default="auto",
    show_default=True,
    help="containers (root, Podman or containerd) or plain processes; auto picks containers when it can",
)
@click.option("--workers", type=click.IntRange(1, 64), default=2, show_default=True,
              help="processes sharing GPU 0 (the processes demo)")  # fmt: skip
@click.option("--alloc-mib", type=click.IntRange(1), default=4096, show_default=True,
              help="device memory each process allocates (the processes demo)")  # fmt: skip
@click.option("--seconds", type=click.FloatRange(0.1, 600), default=3.0, show_default=True,
              help="how long each process launches kernels (the processes demo)")  # fmt: skip
@click.option("--config", type=click.Path(dir_okay=False), help="simulator config file (the processes demo)")
@click.pass_context
def demo(ctx: click.Context, mode: str, workers: int, alloc_mib: int, seconds: float, config: str | None) -> None:
    """Containers (or processes) sharing a simulated GPU, each held to its slice."""
    from gpuslice.cli import container_demo
    from gpuslice.cli import process_demo as demo_mod

    app.sim()
    why = container_demo.available()
    if mode == "containers" or (mode == "auto" and why is None):
        given = [f"--{p.replace('_', '-')}" for p in ("workers", "alloc_mib", "seconds", "config")
                 if ctx.get_parameter_source(p) == click.core.ParameterSource.COMMANDLINE]  # fmt: skip
        if given:
            click.echo(f"({', '.join(given)}: for the processes demo (--mode processes); "
                       "the container demo runs its own workloads)")  # fmt: skip
        try:
            container_demo.run(echo=click.echo)
        except (container_demo.DemoUnavailable, RuntimeError) as e:
            raise click.ClickException(str(e)) from e
        return
    if mode == "auto":
        click.echo(f"(container demo unavailable: {why}; running processes instead)")
    try:
        demo_mod.run(workers, alloc_mib, seconds, config, echo=click.echo)
    except RuntimeError as e:  # gpuslice-sim's SimError is a RuntimeError
        raise click.ClickException(str(e)) from e

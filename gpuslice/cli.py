"""The `gpuslice` command."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict

import click

from gpuslice import __version__, sim


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuslice")
def main() -> None:
    """gpuslice: share NVIDIA GPUs among containers with hard memory limits and compute shares."""


@main.command()
@click.option("--sim", "use_sim", is_flag=True, help="read the simulated GPUs instead of the driver's")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def gpus(use_sim: bool, as_json: bool) -> None:
    """Show the node's GPUs, memory in use and processes (through NVML)."""
    from gpuslice.allocator import inventory
    from gpuslice.gpu_table import render

    if use_sim:
        sim.activate()
    try:
        inv = inventory.read()
    except Exception as e:  # pynvml raises its own error types
        raise click.ClickException(f"cannot read GPUs through NVML: {e}") from e
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
    except (pynvml.NVMLError, sim.SimError) as e:
        click.echo(f"gpuslice daemon: cannot read the GPUs through NVML (nvml: {cfg.nvml}): {e}", err=True)
        sys.exit(2)
    except OSError as e:
        click.echo(f"gpuslice daemon: {e.filename or ''}: {e.strerror}", err=True)
        sys.exit(2)
    node.serve()


@main.command()
@click.option("--socket", "socket_path", type=click.Path(), help="daemon socket (default $GPUSLICE_SOCKET or /run/...)")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def status(socket_path: str | None, as_json: bool) -> None:
    """GPUs and slices as the daemon sees them (nvidia-smi for slices)."""
    import grpc
    from google.protobuf.json_format import MessageToDict

    from gpuslice.client import AllocatorClient
    from gpuslice.status_table import render_status

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


@main.group("sim")
def sim_group() -> None:
    """The simulated NVIDIA driver (for tests and the demo)."""


@sim_group.command("check")
@click.argument("config", required=False, type=click.Path(dir_okay=False))
def sim_check(config: str | None) -> None:
    """Validate a simulator config (default: $GPUSLICE_SIM_CONFIG or the bundled one)."""
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
    for key, value in sim.environment(config, state_dir).items():
        click.echo(f"export {key}={value}")


@sim_group.command("run", context_settings={"ignore_unknown_options": True})
@click.option("--config", type=click.Path(dir_okay=False), help="simulator config file")
@click.option("--state-dir", type=click.Path(file_okay=False), help="shared state directory")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def sim_run(config: str | None, state_dir: str | None, command: tuple[str, ...]) -> None:
    """Run COMMAND with the simulated driver as its libcuda and NVML."""
    sim.libs()
    os.environ.update(sim.environment(config, state_dir))
    try:
        os.execvp(command[0], list(command))
    except OSError as e:
        raise click.ClickException(f"cannot run {command[0]}: {e.strerror}") from e


@main.command()
@click.option("--workers", default=2, show_default=True, help="processes sharing GPU 0")
@click.option("--alloc-mib", default=4096, show_default=True, help="device memory each process allocates")
@click.option("--seconds", default=3.0, show_default=True, help="how long each process launches kernels")
@click.option("--config", type=click.Path(dir_okay=False), help="simulator config file")
def demo(workers: int, alloc_mib: int, seconds: float, config: str | None) -> None:
    """Run CUDA driver-API workloads on a simulated GPU and show what NVML sees."""
    from gpuslice import demo as demo_mod

    try:
        demo_mod.run(workers, alloc_mib, seconds, config, echo=click.echo)
    except (RuntimeError, sim.SimError) as e:
        raise click.ClickException(str(e)) from e


if __name__ == "__main__":
    main()

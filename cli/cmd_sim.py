"""`gpuslice sim`: the simulated NVIDIA driver (for tests and the demo)."""

from __future__ import annotations

import os

import click

from gpuslice.cli import app


@app.group("sim")
def sim_group() -> None:
    """The simulated NVIDIA driver (for tests and the demo)."""


@sim_group.command("check")
@click.argument("config", required=False, type=click.Path(dir_okay=False))
def sim_check(config: str | None) -> None:
    """Validate a simulator config (default: $GPUSLICE_SIM_CONFIG or the bundled one)."""
    sim = app.sim()
    try:
        n = sim.check_config(config)
    except sim.SimError as e:
        app.fail(f"gpuslice sim check: {e}", app.EXIT_BAD_INPUT)
    click.echo(f"ok: {n} GPU{'s' if n != 1 else ''}")


@sim_group.command("env")
@click.option("--config", type=click.Path(dir_okay=False), help="simulator config file")
@click.option("--state-dir", type=click.Path(file_okay=False), help="shared state directory")
def sim_env(config: str | None, state_dir: str | None) -> None:
    """Print shell exports that make programs use the simulated driver."""
    for key, value in app.sim().environment(config, state_dir).items():
        click.echo(f"export {key}={value}")


@sim_group.command("run", context_settings={"ignore_unknown_options": True})
@click.option("--config", type=click.Path(dir_okay=False), help="simulator config file")
@click.option("--state-dir", type=click.Path(file_okay=False), help="shared state directory")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def sim_run(config: str | None, state_dir: str | None, command: tuple[str, ...]) -> None:
    """Run COMMAND with the simulated driver as its libcuda and NVML."""
    sim = app.sim()
    try:
        sim.libs()
    except sim.SimError as e:
        raise click.ClickException(str(e)) from e
    os.environ.update(sim.environment(config, state_dir))
    try:
        os.execvp(command[0], list(command))
    except OSError as e:
        raise click.ClickException(f"cannot run {command[0]}: {e.strerror}") from e

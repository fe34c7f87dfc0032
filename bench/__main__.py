"""`./dev.sh bench [NAME...]` (python -m bench from the checkout): run benchmarks
and print what they measured.  Developer tooling, not shipped in the packages."""

from __future__ import annotations

import click

from bench import (
    admission_webhook,
    compute_shares,
    compute_tick,
    container_start,
    daemon_rpc,
    device_plugin,
    dra_prepare,
    driver_memory,
    fit_noise,
    interposer_calls,
    scale,
    sim_calls,
)

BENCHMARKS = {
    "sim-calls": sim_calls.main,
    "daemon-rpc": daemon_rpc.main,
    "interposer-calls": interposer_calls.main,
    "container-start": container_start.main,
    "compute-shares": compute_shares.main,
    "compute-tick": compute_tick.main,
    "scale": scale.main,
    "dra-prepare": dra_prepare.main,
    "device-plugin": device_plugin.main,
    "driver-memory": driver_memory.main,
    "admission-webhook": admission_webhook.main,
    "fit-noise": fit_noise.main,
}


@click.command()
@click.argument("names", nargs=-1, type=click.Choice(sorted(BENCHMARKS)))
def main(names: tuple[str, ...]) -> None:
    """Run the named benchmarks (default: all)."""
    for name in names or tuple(BENCHMARKS):
        click.echo(f"== {name} ==")
        BENCHMARKS[name]()


if __name__ == "__main__":
    main()

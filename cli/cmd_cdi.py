"""`gpuslice cdi`: the node's CDI spec of kind gpuslice.io/gpu."""

from __future__ import annotations

import json
from pathlib import Path

import click

from gpuslice import paths
from gpuslice.cdi import generate as gen
from gpuslice.cli import app

_D = gen.Options()


@app.group("cdi")
def cdi_group() -> None:
    """CDI specs of kind gpuslice.io/gpu."""


@cdi_group.command("generate")
@click.option("--driver", type=click.Choice(["nvidia", "sim"]), default=_D.driver, show_default=True)
@click.option("--driver-root", type=click.Path(file_okay=False), default=str(_D.driver_root), show_default=True)
@click.option(
    "--output",
    type=click.Path(dir_okay=False),
    default=str(gen.OUTPUT),
    show_default=True,
    help="the spec file (.json, or .yaml/.yml for YAML)",
)
@click.option(
    "--hook", type=click.Path(dir_okay=False), default=_D.hook, help="gpuslice-hook on the host (default: PATH)"
)
@click.option("--daemon-socket", default=_D.daemon_socket, show_default=True)
@click.option("--slice-dir", default=_D.slice_dir, show_default=True, help="host dir of the slice socket")
@click.option("--sim-config", type=click.Path(dir_okay=False), help="simulator config to mount (--driver sim)")
@click.option("--sim-state-dir", type=click.Path(file_okay=False), help="simulator state to mount (--driver sim)")
@click.option("--stdout", "to_stdout", is_flag=True, help="print the spec instead of writing it")
def cdi_generate(output: str, to_stdout: bool, **options: str) -> None:
    """Discover the GPUs and the driver's files and write the CDI spec."""
    from gpuslice.cdi import driver_files

    hook = options.pop("hook") or str(paths.executable("gpuslice-hook"))
    opts = gen.Options(driver_root=Path(options.pop("driver_root")), hook=hook, **options)  # type: ignore[arg-type]
    if opts.driver == "sim":
        app.sim().activate(opts.sim_config, opts.sim_state_dir)
    app.after_failure("; no CDI spec written")
    # the errors reach reread_if_changed as they are: an incomplete driver is waited for there
    with driver_files.reread_if_changed(opts.driver_root, opts.driver == "nvidia" and not to_stdout):
        _write_spec(opts, Path(output), to_stdout)


def _write_spec(opts: gen.Options, output: Path, to_stdout: bool) -> None:
    from gpuslice import inventory
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
    except cdi_spec.SpecError as e:  # not valid: a failed check (1), each reason on its line
        app.fail("\n".join(f"gpuslice: {line}" for line in str(e).splitlines()))
    click.echo(f"ok: {spec.kind}, {len(spec.devices)} devices, cdiVersion {spec.version}")

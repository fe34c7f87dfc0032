"""`gpuslice install` and `uninstall`: a container runtime configured for gpuslice, and back."""

from __future__ import annotations

from pathlib import Path

import click

from gpuslice import paths
from gpuslice.cli import app
from gpuslice.cli.cmd_kube import RUNTIME_VERSION
from gpuslice.cli.host_files import HostFiles

TARGETS = click.Choice(["containerd", "crio", "podman", "docker"])
RUNTIME_BINARY = click.option(
    "--runtime-binary", "binary", default="", help="the runtime to ask its version (default: containerd, dockerd)"
)


@app.command("install")
@click.argument("target", type=TARGETS)
@click.option("--root", default="/", show_default=True, help="filesystem root to configure")
@click.option("--shim", default="", help="gpuslice-runtime path (default: PATH)")
@click.option("--hook", default="", help="gpuslice-hook path (default: PATH)")
@RUNTIME_BINARY
@RUNTIME_VERSION
@click.option("--dry-run", is_flag=True, help="print the change, write nothing")
def install_cmd(target: str, dry_run: bool, **ctx_args: str) -> None:
    """Configure a container runtime to use gpuslice, for its version (idempotent)."""
    _install(target, ctx_args, dry_run)


@app.command("uninstall")
@click.argument("target", type=TARGETS)
@click.option("--root", default="/", show_default=True, help="filesystem root to configure")
@click.option("--dry-run", is_flag=True, help="print the change, write nothing")
def uninstall_cmd(target: str, dry_run: bool, **ctx_args: object) -> None:
    """Undo `gpuslice install TARGET`: each file back as it was, unless edited since."""
    _install(target, {**ctx_args, "remove": True}, dry_run)


def _install(target: str, ctx_args: dict, dry_run: bool) -> None:
    from gpuslice.cli import install as installer

    version = ctx_args.pop("runtime_version", None)
    ctx = installer.Context(
        root=Path(ctx_args.pop("root")), version=installer.parse_version(version) if version else None, **ctx_args
    )
    if not ctx.remove:
        ctx.shim = ctx.shim or str(paths.executable("gpuslice-runtime"))
        ctx.hook = ctx.hook or str(paths.executable("gpuslice-hook"))
    files = HostFiles(installer.record_path(ctx, target))
    changes = installer.plan(target, ctx, files)
    pending = [c for c in changes if c.changes]
    if not pending and not (ctx.remove and files.entries):
        click.echo(f"{target}: nothing to change")
        return
    if dry_run:
        for c in pending:
            click.echo(c.diff(), nl=False)
        return
    installer.apply(changes, files, ctx.remove)
    for c in pending:
        click.echo(f"{'removed' if c.after is None else 'wrote'} {c.path}")

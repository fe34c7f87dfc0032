"""The `gpuslice` command: the composition root, the one place that may import
every component (core, cdi, the daemon) to wire them to a command line. Each
command family is its own module (cli/cmd_*.py), imported only when one of its
commands runs (or help lists them): the daemon does not load the cluster
integrations, nor `gpuslice status` the daemon. Their errors become one line
and an exit status in one place (cli/app.py)."""

from __future__ import annotations

import importlib
import signal
import sys

import click

from gpuslice import stack_dump
from gpuslice.cli import app

# each command's name, and the module and function that make it
COMMANDS = {
    "gpus": ("cmd_node", "gpus"),
    "daemon": ("cmd_node", "daemon"),
    "status": ("cmd_node", "status"),
    "resize": ("cmd_node", "resize"),
    "cdi": ("cmd_cdi", "cdi_group"),
    "selftest": ("cmd_node", "selftest_cmd"),
    "kubelet-plugin": ("cmd_kube", "kubelet_plugin"),
    "device-plugin": ("cmd_kube", "device_plugin_cmd"),
    "scheduler-extender": ("cmd_kube", "scheduler_extender"),
    "node-agent": ("cmd_kube", "node_agent_cmd"),
    "admission-webhook": ("cmd_kube", "admission_webhook"),
    "install": ("cmd_install", "install_cmd"),
    "uninstall": ("cmd_install", "uninstall_cmd"),
    "sim": ("cmd_sim", "sim_group"),
    "demo": ("cmd_node", "demo"),
}


class Main(app.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attribute = COMMANDS[name]
        command: click.Command = getattr(importlib.import_module(f"gpuslice.cli.{module}"), attribute)
        return command


def _version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    # the version looked up only when asked: importlib.metadata is a tenth of `gpuslice status`
    if value and not ctx.resilient_parsing:
        from gpuslice import __version__

        click.echo(f"gpuslice, version {__version__}")
        ctx.exit()


@click.group(cls=Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_version,
              help="Show the version and exit.")  # fmt: skip
def main() -> None:
    """gpuslice: share NVIDIA GPUs among containers with hard memory limits and compute shares."""
    # any gpuslice process that seems stuck (the daemon, the node agent, a selftest) says where
    # each of its threads is: `kill -USR1 <pid>` prints their stacks to stderr, and it goes on
    # (the process's own stderr: a caller may have swapped sys.stderr for one without a file)
    if sys.__stderr__ is not None:
        stack_dump.dump_on(signal.SIGUSR1, sys.__stderr__)


if __name__ == "__main__":
    main()

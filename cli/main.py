"""The `gpuslice` command: the composition root, the one place that may import
every component (core, cdi, the daemon) to wire them to a command line. Each
command family is its own module (cli/cmd_*.py); their errors become one line
and an exit status in one place (cli/app.py)."""

from __future__ import annotations

import click

from gpuslice import __version__
from gpuslice.cli import app, cmd_cdi, cmd_install, cmd_kube, cmd_node, cmd_sim


@app.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuslice")
def main() -> None:
    """gpuslice: share NVIDIA GPUs among containers with hard memory limits and compute shares."""


for command in (
    cmd_node.gpus,
    cmd_node.daemon,
    cmd_node.status,
    cmd_cdi.cdi_group,
    cmd_node.selftest_cmd,
    cmd_kube.kubelet_plugin,
    cmd_kube.device_plugin_cmd,
    cmd_kube.scheduler_extender,
    cmd_kube.node_agent_cmd,
    cmd_kube.admission_webhook,
    cmd_install.install_cmd,
    cmd_install.uninstall_cmd,
    cmd_sim.sim_group,
    cmd_node.demo,
):
    main.add_command(command)

if __name__ == "__main__":
    main()

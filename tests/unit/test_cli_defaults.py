"""Each command's defaults have one home, its component's configuration type:
the command line shows and passes exactly those (and the node agent the
daemon's own), and the components are built from the options by keyword."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click
import pytest

from gpuslice.admission.options import WebhookOptions
from gpuslice.allocator.config import Config
from gpuslice.cdi import generate as gen
from gpuslice.cli import cmd_cdi, cmd_kube
from gpuslice.cli.node_agent_options import RUNTIMES
from gpuslice.cli.node_agent_options import Options as AgentOptions
from gpuslice.device_plugin.options import ExtenderOptions
from gpuslice.device_plugin.options import Options as DevicePluginOptions
from gpuslice.dra.options import Options as DraOptions

CASES = {
    "kubelet-plugin": (cmd_kube.kubelet_plugin, DraOptions(""), 7),
    "device-plugin": (cmd_kube.device_plugin_cmd, DevicePluginOptions(""), 4),
    "scheduler-extender": (cmd_kube.scheduler_extender, ExtenderOptions(), 2),
    "node-agent": (cmd_kube.node_agent_cmd, AgentOptions(), 13),
    "cdi generate": (cmd_cdi.cdi_generate, gen.Options(), 5),
    "admission-webhook": (cmd_kube.admission_webhook, WebhookOptions(), 9),
}


def shown(value: object) -> object:
    return str(value) if isinstance(value, Path) else value


def given(p: click.Parameter) -> object:
    """The option's default; None where it has none (click's unset marker)."""
    return None if p.default is None or "UNSET" in repr(p.default) else p.default


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_command_lines_defaults_are_the_components(name):
    command, defaults, at_least = CASES[name]
    fields = {f.name for f in dataclasses.fields(defaults)}
    compared = {p.name: (given(p), shown(getattr(defaults, p.name))) for p in command.params
                if p.name in fields and not p.required}  # fmt: skip
    assert len(compared) >= at_least, compared  # the options are named as the type's fields
    assert {k: a for k, (a, _) in compared.items()} == {k: b for k, (_, b) in compared.items()}


def test_the_node_agents_daemon_defaults_are_the_daemons():
    agent = AgentOptions()
    assert (agent.metrics_port, agent.compute_period) == (Config.metrics_port, Config.compute_period)
    runtime = next(p for p in cmd_kube.node_agent_cmd.params if p.name == "runtime")
    assert isinstance(runtime.type, click.Choice) and tuple(runtime.type.choices) == RUNTIMES


def test_the_options_reach_the_component_by_name(monkeypatch):
    """`gpuslice kubelet-plugin` builds the plugin's Options from its options by keyword."""
    from gpuslice.cli import app
    from gpuslice.dra import plugin

    got = []
    monkeypatch.setattr(plugin, "Plugin", got.append)
    monkeypatch.setattr(app, "serve", lambda make: make())
    cmd_kube.kubelet_plugin.main(["--node-name", "n1", "--resync", "7", "--cdi-spec", "/x.json"], standalone_mode=False)
    assert got == [DraOptions("n1", republish_s=7.0, base_spec=Path("/x.json"))]

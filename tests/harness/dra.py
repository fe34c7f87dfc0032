"""The DRA side of a node for tests: tools/dra_node.py's plugin and stand-in
API server, driven by a stand-in kubelet (tests/clients/kubelet_dra.py, its own
process, built from the official kubelet protos)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from gpuslice.cli.sim_daemon import RunningDaemon, cdi_generate
from tests.harness import CLIENTS, REPO
from tests.harness.kubelet_api import write_descriptor_sets
from tools.dra_node import NODE, PluginNode, Result, allocated, listening

__all__ = ["NODE", "DraNode", "Result", "allocated", "listening"]


class DraNode(PluginNode):
    """The plugin's node, and a kubelet that calls it."""

    def __init__(
        self, d: RunningDaemon, spec: Path, tmp: Path, claim_specs: Path, gpuslice: list[str] | None = None
    ) -> None:
        super().__init__(d, spec, tmp, claim_specs, gpuslice)
        self.protos = tmp / "kubelet-protos"

    def kubelet(self, *args: str) -> dict:
        if not (self.protos / "v1.pb").exists():
            write_descriptor_sets(self.protos)
        r = subprocess.run([sys.executable, str(CLIENTS / "kubelet_dra.py"), str(self.protos), *args],
                           capture_output=True, text=True, timeout=120, cwd=REPO)  # fmt: skip
        assert r.returncode == 0, r.stderr + self.log()
        return json.loads(r.stdout)

    def prepare(self, *claims: dict, version: str = "v1") -> dict:
        refs = [{k: c["metadata"][k] for k in ("uid", "namespace", "name")} for c in claims]
        return self.kubelet("prepare", str(self.endpoint), version, json.dumps(refs))["claims"]

    @classmethod
    @contextlib.contextmanager
    def serving(cls, d: RunningDaemon, tmp: Path) -> Iterator[DraNode]:
        """A node on daemon `d`: its CDI spec generated under `tmp`, the plugin started, and stopped after."""
        spec = tmp / "cdi" / "gpuslice.json"
        spec.parent.mkdir()
        r = cdi_generate(d, spec)
        assert r.returncode == 0, r.stderr
        node = cls(d, spec, tmp, tmp / "run-cdi")
        node.start_plugin()
        try:
            yield node
        finally:
            node.close()

    def unprepare(self, *claims: dict, version: str = "v1") -> dict:
        refs = [{k: c["metadata"][k] for k in ("uid", "namespace", "name")} for c in claims]
        return self.kubelet("unprepare", str(self.endpoint), version, json.dumps(refs))["claims"]

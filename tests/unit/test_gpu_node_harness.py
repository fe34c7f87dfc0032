"""The runtime tests' GPU node (tests/harness/gpu_node.py) refuses to start beside another
spec defining its devices: a spec left in /var/run/cdi by a killed run made Docker 26 answer
"unresolvable CDI devices gpuslice.io/gpu=0" in a later run, as if gpuslice were wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.cdi import spec as cdi_spec
from gpuslice.cdi.spec import KIND, ContainerEdits, Device, Spec
from tests.harness.gpu_node import assert_alone_in_its_directory

pytestmark = pytest.mark.unit


def _write(path: Path, names: tuple[str, ...], kind: str = KIND) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    cdi_spec.write(Spec(kind, tuple(Device(n, ContainerEdits(env=(f"WHO={path.name}",))) for n in names)), path)
    return path


def test_a_leftover_spec_defining_the_same_devices_is_named(tmp_path):
    ours = _write(tmp_path / "cdi/gpuslice-docker.json", ("0", "all"))
    _write(tmp_path / "cdi/other-devices.json", ("7",))  # other names of the kind: no conflict
    _write(tmp_path / "cdi/another-kind.json", ("0",), kind="example.com/card")
    assert_alone_in_its_directory(ours)
    _write(tmp_path / "cdi/gpuslice-dra.json", ("0", "1", "all"))
    with pytest.raises(AssertionError, match=r"gpuslice-dra\.json also defines gpuslice\.io/gpu=0,all: .*remove it"):
        assert_alone_in_its_directory(ours)

"""The committed gRPC code is what the proto generates today."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.harness import REPO

ROOT = REPO


@pytest.mark.parametrize("proto", sorted(p.stem for p in (ROOT / "gpuslice" / "proto").glob("*.proto")))
def test_generated_code_matches_the_proto(tmp_path, proto):
    shutil.copytree(ROOT / "gpuslice" / "proto", tmp_path / "gpuslice" / "proto")
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", ".", "--python_out=.", "--grpc_python_out=.",
         "--pyi_out=.", f"gpuslice/proto/{proto}.proto"],
        cwd=tmp_path,
        check=True,
    )  # fmt: skip
    for name in (f"{proto}_pb2.py", f"{proto}_pb2_grpc.py", f"{proto}_pb2.pyi"):
        fresh = (tmp_path / "gpuslice" / "proto" / name).read_text()
        assert fresh == (ROOT / "gpuslice" / "proto" / name).read_text(), (
            f"{name} is stale: regenerate (docs/daemon.md)"
        )

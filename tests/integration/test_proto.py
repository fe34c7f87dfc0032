"""The committed gRPC code is what the proto generates today."""

from __future__ import annotations

import shutil
import subprocess
import sys

from tests.harness import REPO

ROOT = REPO


def test_generated_code_matches_the_proto(tmp_path):
    shutil.copytree(ROOT / "gpuslice" / "proto", tmp_path / "gpuslice" / "proto")
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", ".", "--python_out=.", "--grpc_python_out=.",
         "--pyi_out=.", "gpuslice/proto/gpuslice.proto"],
        cwd=tmp_path,
        check=True,
    )  # fmt: skip
    for name in ("gpuslice_pb2.py", "gpuslice_pb2_grpc.py", "gpuslice_pb2.pyi"):
        fresh = (tmp_path / "gpuslice" / "proto" / name).read_text()
        assert fresh == (ROOT / "gpuslice" / "proto" / name).read_text(), (
            f"{name} is stale: regenerate (docs/daemon.md)"
        )

"""Wire compatibility of gpuslice's own declarations of the kubelet's DRA and
plugin-registration services with the kubelet's api.proto files in
../shared/reference: the same packages, services, methods, messages, and for
every field of ours the same number, name, type and label."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from tests.harness import REPO, shared_reference

OURS = REPO / "gpuslice" / "proto"
PAIRS = {
    "kubelet_dra_v1": "kubelet/dra/v1",
    "kubelet_dra_v1beta1": "kubelet/dra/v1beta1",
    "kubelet_pluginregistration": "kubelet/pluginregistration/v1",
}


def descriptor(include: Path, name: str, out: Path) -> descriptor_pb2.FileDescriptorProto:
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{include}", f"--descriptor_set_out={out}", name],
                   check=True, capture_output=True)  # fmt: skip
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    assert len(files) == 1
    return files[0]


def fields(message: descriptor_pb2.DescriptorProto) -> dict[int, tuple]:
    return {f.number: (f.name, f.type, f.label, f.type_name, f.proto3_optional) for f in message.field}


@pytest.mark.parametrize("ours", sorted(PAIRS))
def test_our_declarations_match_the_kubelets_on_the_wire(tmp_path, ours):
    official = descriptor(shared_reference("kubernetes") / PAIRS[ours], "api.proto", tmp_path / "official.pb")
    mine = descriptor(OURS, f"{ours}.proto", tmp_path / "ours.pb")
    assert mine.package == official.package
    assert [(s.name, [(m.name, m.input_type, m.output_type) for m in s.method]) for s in mine.service] == [
        (s.name, [(m.name, m.input_type, m.output_type) for m in s.method]) for s in official.service
    ]
    theirs = {m.name: m for m in official.message_type}
    for message in mine.message_type:
        assert message.name in theirs, message.name
        # every field we declare is theirs exactly; map entries (nested types) too
        assert fields(message) == fields(theirs[message.name]), message.name
        nested = {n.name: fields(n) for n in theirs[message.name].nested_type}
        assert {n.name: fields(n) for n in message.nested_type} == nested, message.name

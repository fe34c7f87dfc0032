"""Wire compatibility of gpuslice's own declarations of the kubelet's DRA,
plugin-registration, device-plugin and pod-resources services with the
kubelet's official api.proto files (reference "kubelet", fetched from Debian):
the same packages, services and methods, and for every message of ours the
same fields by number, name, type and label."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from tests.harness import REPO
from tests.harness.kubelet_api import PROTOS
from tests.harness.references import compile_descriptor_set, descriptor_set

OURS = REPO / "gpuslice" / "proto"
Message = descriptor_pb2.DescriptorProto
LABELS = {1: "optional", 2: "required", 3: "repeated"}


def our_descriptor(proto: Path, out: Path) -> descriptor_pb2.FileDescriptorProto:
    (file,) = compile_descriptor_set([proto.parent], proto.name, out).file  # ours import nothing
    return file


def official(which: str, out: Path) -> descriptor_pb2.FileDescriptorProto:
    return descriptor_set("kubelet", PROTOS[which], out).file[-1]


def _field(f: descriptor_pb2.FieldDescriptorProto, package: str) -> str:
    type_name = f.type_name.removeprefix(f".{package}.") or descriptor_pb2.FieldDescriptorProto.Type.Name(f.type)
    optional = " (proto3 optional)" if f.proto3_optional else ""
    return f"{LABELS[f.label]} {type_name.removeprefix('TYPE_').lower()} {f.name}{optional}"


def _message_differences(path: str, mine: Message, theirs: Message, packages: tuple[str, str]) -> set[str]:
    ours = {f.number: _field(f, packages[0]) for f in mine.field}
    official_fields = {f.number: _field(f, packages[1]) for f in theirs.field}
    found = {
        f"{path} field {n}: ours {ours.get(n, 'none')}, theirs {official_fields.get(n, 'none')}"
        for n in ours.keys() | official_fields.keys()
        if ours.get(n) != official_fields.get(n)
    }
    nested = {n.name: n for n in theirs.nested_type}  # map entries
    for n in mine.nested_type:
        if n.name not in nested:
            found.add(f"{path}.{n.name}: not theirs")
        else:
            found |= _message_differences(f"{path}.{n.name}", n, nested[n.name], packages)
    return found


def differences(mine: descriptor_pb2.FileDescriptorProto, theirs: descriptor_pb2.FileDescriptorProto) -> set[str]:
    """What a peer speaking `theirs` would see differently on the wire from
    ours, one line each: package, services and methods, and every field of the
    messages we declare (we may declare fewer messages than they do). Type
    names are compared within each file's package."""
    found = set() if mine.package == theirs.package else {f"package: ours {mine.package}, theirs {theirs.package}"}
    packages = (mine.package, theirs.package)

    def methods(file: descriptor_pb2.FileDescriptorProto) -> dict[str, list[tuple[str, str, str]]]:
        strip = f".{file.package}."
        return {
            s.name: [(m.name, m.input_type.removeprefix(strip), m.output_type.removeprefix(strip)) for m in s.method]
            for s in file.service
        }

    ours_methods, their_methods = methods(mine), methods(theirs)
    for service in ours_methods.keys() | their_methods.keys():
        if ours_methods.get(service) != their_methods.get(service):
            found.add(f"service {service}: ours {ours_methods.get(service)}, theirs {their_methods.get(service)}")
    their_messages = {m.name: m for m in theirs.message_type}
    for message in mine.message_type:
        if message.name not in their_messages:
            found.add(f"message {message.name}: not theirs")
        else:
            found |= _message_differences(message.name, message, their_messages[message.name], packages)
    return found


@pytest.mark.parametrize(("ours", "which"), [("kubelet_dra_v1beta1", "v1beta1"),
                                             ("kubelet_pluginregistration", "reg"),
                                             ("kubelet_deviceplugin_v1beta1", "deviceplugin"),
                                             ("kubelet_podresources_v1", "podresources")])  # fmt: skip
def test_our_declarations_match_the_kubelets_on_the_wire(tmp_path, ours, which):
    assert differences(our_descriptor(OURS / f"{ours}.proto", tmp_path / "ours.pb"),
                       official(which, tmp_path / "official.pb")) == set()  # fmt: skip


def test_our_dra_v1_is_the_official_v1beta1_plus_what_v1_adds(tmp_path):
    """Debian's kubelet API (Kubernetes 1.32) predates dra/v1 (1.34), so our v1
    declaration is held to the official v1beta1, and may differ from it only
    by what Kubernetes changed for v1: the package, and Device.share_id."""
    mine = our_descriptor(OURS / "kubelet_dra_v1.proto", tmp_path / "ours.pb")
    assert differences(mine, official("v1beta1", tmp_path / "official.pb")) == {
        "package: ours k8s.io.kubelet.pkg.apis.dra.v1, theirs k8s.io.kubelet.pkg.apis.dra.v1beta1",
        "Device field 5: ours optional string share_id (proto3 optional), theirs none",
    }


def test_a_field_number_changed_in_our_copy_is_a_wire_difference(tmp_path):
    """The comparison fails on a real mismatch: cdi_device_ids moved from 4 to 6
    in a copy of our v1beta1 declaration."""
    proto = OURS / "kubelet_dra_v1beta1.proto"
    text = proto.read_text()
    assert text.count("cdi_device_ids = 4;") == 1
    changed = tmp_path / "src" / proto.name
    changed.parent.mkdir()
    changed.write_text(text.replace("cdi_device_ids = 4;", "cdi_device_ids = 6;"))
    assert differences(our_descriptor(changed, tmp_path / "ours.pb"), official("v1beta1", tmp_path / "o.pb")) == {
        "Device field 4: ours none, theirs repeated string cdi_device_ids",
        "Device field 6: ours repeated string cdi_device_ids, theirs none",
    }

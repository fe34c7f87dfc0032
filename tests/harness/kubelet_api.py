"""The kubelet's plugin APIs as the stand-in kubelets speak them: the official
protos (reference "kubelet", tests/harness/references.py) compiled into
descriptor sets that a stand-in loads into a descriptor pool of its own, so no
generated code and no clash with gpuslice's own declarations of the same
messages.

The packaged kubelet API is Kubernetes 1.32's, which has no dra/v1 (added in
1.34). Kubernetes made dra/v1 from dra/v1beta1 by renaming the package and
adding one optional field, Device.share_id = 5; `dra_v1` makes exactly that
from the official v1beta1, so a stand-in can speak v1 as a 1.34+ kubelet does."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import descriptor_pb2

from tests.harness.references import descriptor_set

DRA_V1BETA1 = "k8s.io.kubelet.pkg.apis.dra.v1beta1"
DRA_V1 = "k8s.io.kubelet.pkg.apis.dra.v1"
# the official protos by the names the stand-ins use, relative to the reference
PROTOS = {
    "reg": "pluginregistration/v1/api.proto",
    "v1beta1": "dra/v1beta1/api.proto",
    "deviceplugin": "deviceplugin/v1beta1/api.proto",
    "podresources": "podresources/v1/api.proto",
}
Field = descriptor_pb2.FieldDescriptorProto


def _repackage(message: descriptor_pb2.DescriptorProto, old: str, new: str) -> None:
    for f in message.field:
        if f.type_name.startswith(old):
            f.type_name = new + f.type_name[len(old) :]
    for nested in message.nested_type:
        _repackage(nested, old, new)


def dra_v1(v1beta1: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    """dra/v1 as Kubernetes 1.34 declares it, from the official dra/v1beta1:
    package k8s.io.kubelet.pkg.apis.dra.v1, and `optional string share_id = 5`
    in Device."""
    assert v1beta1.package == DRA_V1BETA1, v1beta1.package
    v1 = descriptor_pb2.FileDescriptorProto()
    v1.CopyFrom(v1beta1)
    v1.name, v1.package = "dra/v1/api.proto", DRA_V1
    v1.options.go_package = "k8s.io/kubelet/pkg/apis/dra/v1"
    old, new = f".{DRA_V1BETA1}.", f".{DRA_V1}."
    for message in v1.message_type:
        _repackage(message, old, new)
    for service in v1.service:
        for method in service.method:
            method.input_type = method.input_type.replace(old, new)
            method.output_type = method.output_type.replace(old, new)
    (device,) = [m for m in v1.message_type if m.name == "Device"]
    assert 5 not in {f.number for f in device.field}
    device.oneof_decl.add(name="_share_id")  # proto3 `optional` is a synthetic oneof
    device.field.add(name="share_id", number=5, type=Field.TYPE_STRING, label=Field.LABEL_OPTIONAL,
                     json_name="shareId", proto3_optional=True, oneof_index=len(device.oneof_decl) - 1)  # fmt: skip
    return v1


def write_descriptor_sets(out: Path) -> None:
    """OUT/{reg,v1beta1,v1,deviceplugin,podresources}.pb, for a stand-in to load."""
    out.mkdir(parents=True, exist_ok=True)
    for which, proto in PROTOS.items():
        descriptor_set("kubelet", proto, out / f"{which}.pb")
    v1 = descriptor_pb2.FileDescriptorSet.FromString((out / "v1beta1.pb").read_bytes())
    v1.file[-1].CopyFrom(dra_v1(v1.file[-1]))
    (out / "v1.pb").write_bytes(v1.SerializeToString())

"""A stand-in kubelet for DRA, over the kubelet's own protos: descriptor sets
that tests/harness/kubelet_api.py compiles from the official files, loaded here
into a descriptor pool of their own. It runs as its own process, so nothing of
gpuslice's (its declarations of the same messages) is near it.

  kubelet_dra.py OUT register REGISTRY_SOCKET
      GetInfo, check it as the kubelet does, NotifyRegistrationStatus; print
      the plugin's info and the service version chosen (v1 over v1beta1)
  kubelet_dra.py OUT prepare|unprepare ENDPOINT VERSION CLAIMS_JSON
      NodePrepareResources / NodeUnprepareResources for [{uid, namespace, name}]

OUT holds the descriptor sets ({reg,v1,v1beta1}.pb). One JSON line out."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FileDescriptor
from google.protobuf.json_format import MessageToDict


class Api:
    """One official proto file's messages and methods, from its descriptor set."""

    def __init__(self, out: Path, which: str) -> None:
        files = descriptor_pb2.FileDescriptorSet.FromString((out / f"{which}.pb").read_bytes()).file
        pool = descriptor_pool.DescriptorPool()
        for f in files:  # dependencies first, as protoc writes them
            pool.Add(f)
        self.file: FileDescriptor = pool.FindFileByName(files[-1].name)

    def message(self, name: str, /, **fields: Any) -> Any:
        return message_factory.GetMessageClass(self.file.message_types_by_name[name])(**fields)

    def call(self, channel: grpc.Channel, service: str, method: str, request: Any, timeout: float) -> Any:
        m = self.file.services_by_name[service].methods_by_name[method]
        reply = message_factory.GetMessageClass(m.output_type)
        stub = channel.unary_unary(
            f"/{m.containing_service.full_name}/{m.name}",
            request_serializer=lambda r: r.SerializeToString(),
            response_deserializer=reply.FromString,
        )
        return stub(request, timeout=timeout)


def as_dict(message: Any) -> dict:
    return MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def register(out: Path, socket: str) -> dict:
    reg = Api(out, "reg")
    with grpc.insecure_channel(f"unix://{socket}") as ch:
        info = reg.call(ch, "Registration", "GetInfo", reg.message("InfoRequest"), 10)
        # what the kubelet checks: the type, and a DRAPlugin service it speaks
        versions = list(info.supported_versions)
        chosen = next((v for v in ("v1.DRAPlugin", "v1beta1.DRAPlugin") if v in versions), "")
        ok = info.type == "DRAPlugin" and bool(chosen)
        error = "" if ok else f"type {info.type!r}, services {versions}: none the kubelet speaks"
        status = reg.message("RegistrationStatus", plugin_registered=ok, error=error)
        reg.call(ch, "Registration", "NotifyRegistrationStatus", status, 10)
    return {"info": MessageToDict(info, preserving_proto_field_name=True), "chosen": chosen, "error": error}


def call(out: Path, verb: str, endpoint: str, version: str, claims: list[dict]) -> dict:
    dra = Api(out, version)
    method, request = {
        "prepare": ("NodePrepareResources", "NodePrepareResourcesRequest"),
        "unprepare": ("NodeUnprepareResources", "NodeUnprepareResourcesRequest"),
    }[verb]
    req = dra.message(request, claims=[dra.message("Claim", **c) for c in claims])
    with grpc.insecure_channel(f"unix://{endpoint}") as ch:
        return as_dict(dra.call(ch, "DRAPlugin", method, req, 30))


def main() -> None:
    out, verb = Path(sys.argv[1]), sys.argv[2]
    if verb == "register":
        print(json.dumps(register(out, sys.argv[3])))
    else:
        print(json.dumps(call(out, verb, sys.argv[3], sys.argv[4], json.loads(sys.argv[5]))))


if __name__ == "__main__":
    main()

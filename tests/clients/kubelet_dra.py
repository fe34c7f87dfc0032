"""A stand-in kubelet for DRA, over the kubelet's own protos (../shared/reference,
compiled at test time). It runs as its own process: those protos declare the
same message names as gpuslice's copies, and one process cannot load both.

  kubelet_dra.py OUT register REGISTRY_SOCKET
      GetInfo, check it as the kubelet does, NotifyRegistrationStatus; print
      the plugin's info and the service version chosen (v1 over v1beta1)
  kubelet_dra.py OUT prepare|unprepare ENDPOINT VERSION CLAIMS_JSON
      NodePrepareResources / NodeUnprepareResources for [{uid, namespace, name}]

OUT holds the compiled protos (made on first use). One JSON line out."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import grpc
from google.protobuf.json_format import MessageToDict

REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference" / "kubernetes" / "kubelet"
PROTOS = {"reg": "pluginregistration/v1", "v1": "dra/v1", "v1beta1": "dra/v1beta1"}


def compiled(out: Path, which: str):  # type: ignore[no-untyped-def]
    """The version's api_pb2 and api_pb2_grpc, as a package of their own."""
    pkg = out / f"kubelet_{which}"
    if not (pkg / "api_pb2_grpc.py").exists():
        pkg.mkdir(parents=True, exist_ok=True)
        src = REFERENCE / PROTOS[which]
        subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{src}", f"--python_out={pkg}",
                        f"--grpc_python_out={pkg}", str(src / "api.proto")], check=True)  # fmt: skip
        grpc_code = (pkg / "api_pb2_grpc.py").read_text()
        (pkg / "api_pb2_grpc.py").write_text(grpc_code.replace("import api_pb2 as", "from . import api_pb2 as"))
        (pkg / "__init__.py").write_text("")
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    return importlib.import_module(f"kubelet_{which}.api_pb2"), importlib.import_module(f"kubelet_{which}.api_pb2_grpc")


def register(out: Path, socket: str) -> dict:
    pb, rpc = compiled(out, "reg")
    with grpc.insecure_channel(f"unix://{socket}") as ch:
        stub = rpc.RegistrationStub(ch)
        info = stub.GetInfo(pb.InfoRequest(), timeout=10)
        # what the kubelet checks: the type, and a DRAPlugin service it speaks
        versions = list(info.supported_versions)
        chosen = next((v for v in ("v1.DRAPlugin", "v1beta1.DRAPlugin") if v in versions), "")
        ok = info.type == "DRAPlugin" and bool(chosen)
        error = "" if ok else f"type {info.type!r}, services {versions}: none the kubelet speaks"
        stub.NotifyRegistrationStatus(pb.RegistrationStatus(plugin_registered=ok, error=error), timeout=10)
    return {"info": MessageToDict(info, preserving_proto_field_name=True), "chosen": chosen, "error": error}


def call(out: Path, verb: str, endpoint: str, version: str, claims: list[dict]) -> dict:
    pb, rpc = compiled(out, version)
    with grpc.insecure_channel(f"unix://{endpoint}") as ch:
        stub = rpc.DRAPluginStub(ch)
        if verb == "prepare":
            reply = stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=[pb.Claim(**c) for c in claims]),
                                              timeout=30)  # fmt: skip
        else:
            reply = stub.NodeUnprepareResources(
                pb.NodeUnprepareResourcesRequest(claims=[pb.Claim(**c) for c in claims]), timeout=30
            )
    return MessageToDict(reply, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def main() -> None:
    out, verb = Path(sys.argv[1]), sys.argv[2]
    if verb == "register":
        print(json.dumps(register(out, sys.argv[3])))
    else:
        print(json.dumps(call(out, verb, sys.argv[3], sys.argv[4], json.loads(sys.argv[5]))))


if __name__ == "__main__":
    main()

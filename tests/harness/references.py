"""The official contracts the tests check against, by name: which Debian
package holds each one and where it unpacks.  Fetched at test time through
tests/harness/debian.py (cached under build/debian), never copied into the
repository.  A reference that cannot be had fails the test that asked for it,
in one line naming the package and the suite.

GPUSLICE_REFERENCE_DIR may name a directory laid out as `Reference.override`
says (the layout of the reference copies beside this project's own CI
checkout); a reference found there is read from it instead.  Nothing needs it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import pytest
from google.protobuf import descriptor_pb2
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from tests.harness import debian

GOCODE = "usr/share/gocode/src"


@dataclass(frozen=True)
class Reference:
    package: str  # the Debian package that ships it
    suite: str  # the suite it comes from (the version named in `what`)
    path: str  # the directory inside the unpacked package
    what: str  # what it is, for the docs and error lines
    override: str  # its directory under GPUSLICE_REFERENCE_DIR, if one is given


REFERENCES = {
    "cdi": Reference("golang-tags.cncf-container-device-interface-dev", "sid",
                     f"{GOCODE}/tags.cncf.io/container-device-interface/schema",
                     "CDI 1.0.1 JSON schema and its good/bad test specs", "cdi"),
    "oci-runtime-spec": Reference("golang-github-opencontainers-specs-dev", "sid",
                                  f"{GOCODE}/github.com/opencontainers/runtime-spec/schema",
                                  "OCI runtime-spec 1.2.1 JSON schemas", "oci-runtime-spec"),
    "cri": Reference("golang-k8s-cri-api-dev", "sid", f"{GOCODE}/k8s.io/cri-api/pkg/apis/runtime/v1",
                     "CRI runtime.v1 api.proto (Kubernetes 1.36)", "kubernetes/cri-api/runtime/v1"),
    # pluginregistration/v1, dra/v1beta1, deviceplugin/v1beta1, podresources/v1
    "kubelet": Reference("golang-github-kubernetes-kubelet-dev", "sid", f"{GOCODE}/k8s.io/kubelet/pkg/apis",
                         "kubelet plugin APIs (Kubernetes 1.32)", "kubernetes/kubelet"),
    # LeaderElectionConfiguration, which a KubeSchedulerConfiguration embeds
    "component-base-config": Reference("golang-k8s-component-base-dev", "sid",
                                       f"{GOCODE}/k8s.io/component-base/config/v1alpha1",
                                       "component-base config/v1alpha1 types.go", "kubernetes/component-base-config"),
    # AdmissionReview, AdmissionRequest, AdmissionResponse
    "admission": Reference("golang-k8s-api-dev", "sid", f"{GOCODE}/k8s.io/api/admission/v1",
                           "admission.k8s.io/v1 types.go (Kubernetes 1.36)", "kubernetes/api-admission-v1"),
    # Status, which an AdmissionResponse carries
    "meta": Reference("golang-k8s-apimachinery-dev", "sid", f"{GOCODE}/k8s.io/apimachinery/pkg/apis/meta/v1",
                      "meta/v1 types.go (apimachinery)", "kubernetes/apimachinery-meta-v1"),
    # the kubelet's protos import gogo.proto (Go code generation options only)
    "gogo": Reference("golang-github-gogo-protobuf-dev", "sid", GOCODE,
                      "gogo.proto, imported by the kubelet's protos", "gogo"),
}  # fmt: skip


def go_json_fields(types_go: str, struct: str) -> dict[str, bool]:
    """A Go struct's fields by their json names, read from its source: True
    where the field is always sent (no omitempty). An inlined TypeMeta gives
    apiVersion and kind, both omitempty."""
    body = types_go.split(f"type {struct} struct {{", 1)[1].split("\n}", 1)[0]
    fields = {m.group(1): "omitempty" not in m.group(2) for m in re.finditer(r'json:"([A-Za-z]+)([^"]*)"', body)}
    if re.search(r'TypeMeta `json:",inline"', body):
        fields.update({"apiVersion": False, "kind": False})
    return fields


def reference(name: str) -> Path:
    """The directory holding reference `name`: fetched (once) or from the
    override directory. A test that asks fails if it cannot be had."""
    ref = REFERENCES[name]
    override = os.environ.get("GPUSLICE_REFERENCE_DIR", "").strip()
    if override and (Path(override) / ref.override).is_dir():
        return Path(override) / ref.override
    try:
        root = debian.unpacked((ref.package,), ref.suite) / ref.path
    except debian.FetchError as e:
        pytest.fail(f"reference {name!r} ({ref.what}): {e}", pytrace=False)
    if not root.is_dir():
        pytest.fail(f"reference {name!r}: {ref.package} from Debian {ref.suite} has no {ref.path}", pytrace=False)
    return root


def schema_validator(name: str, schema: str) -> jsonschema.Draft7Validator:
    """A validator for one of the official JSON schemas (CDI, OCI runtime-spec),
    with the schema's sibling files as the targets of its $refs."""
    root = reference(name)
    resources = [
        (p.name, Resource.from_contents(json.loads(p.read_text()), default_specification=DRAFT7))
        for p in root.glob("*.json")
    ]
    return jsonschema.Draft7Validator(
        json.loads((root / schema).read_text()), registry=Registry().with_resources(resources)
    )


def proto_includes(name: str, proto: str) -> list[Path]:
    """The protoc include directories for `proto` (relative to reference
    `name`): its own, and gogo.proto's when it imports it."""
    root = reference(name)
    includes = [root]
    if "gogoproto/gogo.proto" in (root / proto).read_text():
        includes.append(reference("gogo"))
    return includes


def compile_descriptor_set(includes: list[Path], proto: str, out: Path) -> descriptor_pb2.FileDescriptorSet:
    """`proto` (relative to an include directory) compiled by protoc into a
    descriptor set with its imports, dependencies first (written to `out` too)."""
    r = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", *(f"-I{p}" for p in includes),
                        "--include_imports", f"--descriptor_set_out={out}", proto],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    if r.returncode != 0:
        pytest.fail(f"protoc cannot compile {proto}: {r.stderr.strip()[-300:]}", pytrace=False)
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def descriptor_set(name: str, proto: str, out: Path) -> descriptor_pb2.FileDescriptorSet:
    """`proto` of reference `name` compiled (compile_descriptor_set)."""
    return compile_descriptor_set(proto_includes(name, proto), proto, out)

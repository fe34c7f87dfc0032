"""A stand-in for the API server's ResourceClaim and ResourceSlice endpoints
(resource.k8s.io/v1), enough for the kubernetes client the DRA plugin uses:
claims are served as a test puts them; slices are created and replaced with a
resourceVersion, and each one written is validated against the official
Kubernetes 1.37 schema (kubernetes-validate). ResourceClaimTemplates are
created in a namespace (409 AlreadyExists for a name there, the namespace
in the body the path's, validated like the slices) and read back, as the
admission webhook writes them in mode dra; `refuse_templates` answers every
write with that status instead (RBAC's 403, say). A template is patched with
a JSON merge patch (the webhook gives an older one its owner); a
resourceVersion in the patch is a precondition, 409 Conflict when the object
has moved on, as the API conventions have it, and `refuse_template_patches`
answers every patch with that status. Pods (core/v1) are listed across
namespaces with the field selectors the device plugin uses (spec.nodeName,
status.phase), as a test puts them. Nodes (core/v1) are read and patched
with a JSON merge patch (RFC 7386, the only patch type the plugin sends),
the result validated like the slices. MutatingWebhookConfigurations
(admissionregistration.k8s.io/v1) are read by name, as a test puts them: the
owner the webhook names on each template it writes."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import kubernetes_validate
import yaml

from gpuslice.http_json import send_json

K8S_VERSION = "1.37"
BASE = "/apis/resource.k8s.io/v1"


def validate(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null removes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class ApiServer:
    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.slices: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}  # by UID
        self.nodes: dict[str, dict[str, Any]] = {}  # by name
        self.node_patches = 0
        self.pod_lists = 0
        self.writes: list[tuple[str, str]] = []  # (verb, name) of each slice write
        self.templates: dict[tuple[str, str], dict[str, Any]] = {}  # (namespace, name) -> ResourceClaimTemplate
        self.template_posts: list[tuple[str, str]] = []  # (namespace, name) of each create asked, kept or not
        self.refuse_templates: int | None = None
        self.template_patches: list[tuple[str, str]] = []  # (namespace, name) of each patch taken
        self.refuse_template_patches: int | None = None
        self.webhook_configurations: dict[str, dict[str, Any]] = {}  # by name
        self.invalid: list[str] = []
        self._version = 0
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "stand-in",
            "clusters": [{"name": "stand-in", "cluster": {"server": self.url}}],
            "users": [{"name": "node", "user": {"token": "stand-in"}}],
            "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "node"}}],
        }))  # fmt: skip
        return path

    def put_claim(self, claim: dict[str, Any]) -> None:
        validate(claim)
        meta = claim["metadata"]
        self.claims[(meta["namespace"], meta["name"])] = claim

    def put_template(self, template: dict[str, Any]) -> None:
        validate(template)
        meta = template["metadata"]
        with self._lock:
            meta.setdefault("resourceVersion", self._next_version())
            self.templates[(meta["namespace"], meta["name"])] = template

    def put_webhook_configuration(self, configuration: dict[str, Any]) -> None:
        validate(configuration)
        with self._lock:
            self.webhook_configurations[configuration["metadata"]["name"]] = configuration

    def put_pod(self, pod: dict[str, Any], version: str = K8S_VERSION) -> None:
        validate(pod) if version == K8S_VERSION else kubernetes_validate.validate(pod, version, strict=True)
        with self._lock:
            self.pods[pod["metadata"]["uid"]] = pod

    def put_node(self, node: dict[str, Any]) -> None:
        validate(node)
        with self._lock:
            self.nodes[node["metadata"]["name"]] = node

    def set_phase(self, uid: str, phase: str) -> None:
        with self._lock:
            self.pods[uid].setdefault("status", {})["phase"] = phase

    def _selected(self, query: str) -> list[dict[str, Any]]:
        wanted: dict[str, str] = {}
        for part in parse_qs(query).get("fieldSelector", [""])[0].split(","):
            if part:
                key, _, value = part.partition("=")
                wanted[key] = value
        with self._lock:
            self.pod_lists += 1
            pods = list(self.pods.values())
        found = []
        for p in pods:
            fields = {
                "spec.nodeName": p["spec"].get("nodeName", ""),
                "status.phase": (p.get("status") or {}).get("phase", "Pending"),
            }
            if all(fields.get(k) == v for k, v in wanted.items()):
                found.append(p)
        return found

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, code: int, body: dict[str, Any]) -> None:
                send_json(self, code, body)

            def _missing(self) -> None:
                self._send(
                    404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}
                )

            def _body(self) -> dict[str, Any]:
                return json.loads(self.rfile.read(int(self.headers["Content-Length"])))

            def do_GET(self) -> None:
                m = re.fullmatch(r"/api/v1/nodes/([^/?]+)", self.path.split("?")[0])
                if m and m.group(1) in api.nodes:
                    with api._lock:
                        return self._send(200, api.nodes[m.group(1)])
                if self.path.split("?")[0] == "/api/v1/nodes":
                    with api._lock:
                        nodes = list(api.nodes.values())
                    return self._send(200, {"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": nodes})
                if self.path.split("?")[0] == "/api/v1/pods":
                    items = api._selected(self.path.partition("?")[2])
                    return self._send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})
                m = re.fullmatch(BASE + r"/namespaces/([^/]+)/resourceclaims/([^/?]+)", self.path.split("?")[0])
                if m and (m.group(1), m.group(2)) in api.claims:
                    return self._send(200, api.claims[(m.group(1), m.group(2))])
                m = re.fullmatch(BASE + r"/resourceslices/([^/?]+)", self.path.split("?")[0])
                if m and m.group(1) in api.slices:
                    return self._send(200, api.slices[m.group(1)])
                m = re.fullmatch(r"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/([^/?]+)",
                                 self.path.split("?")[0])  # fmt: skip
                if m and m.group(1) in api.webhook_configurations:
                    with api._lock:
                        return self._send(200, api.webhook_configurations[m.group(1)])
                m = re.fullmatch(BASE + r"/namespaces/([^/]+)/resourceclaimtemplates/([^/?]+)", self.path.split("?")[0])
                if m and (m.group(1), m.group(2)) in api.templates:
                    with api._lock:
                        return self._send(200, api.templates[(m.group(1), m.group(2))])
                self._missing()

            def _status(self, code: int, reason: str, message: str = "") -> None:
                self._send(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
                                  "reason": reason, "message": message})  # fmt: skip

            def _create_template(self, namespace: str) -> None:
                body = self._body()
                meta = body.get("metadata") or {}
                with api._lock:
                    api.template_posts.append((namespace, str(meta.get("name"))))
                if api.refuse_templates is not None:
                    return self._status(api.refuse_templates, "Forbidden", "resourceclaimtemplates is forbidden")
                if meta.get("namespace", namespace) != namespace:
                    return self._status(400, "BadRequest", "the namespace of the object does not match the request")
                body["metadata"] = {**meta, "namespace": namespace}
                try:
                    validate(body)
                except Exception as e:
                    api.invalid.append(str(e))
                    return self._status(422, "Invalid", str(e)[:500])
                with api._lock:
                    if (namespace, meta["name"]) in api.templates:
                        return self._status(409, "AlreadyExists")
                    body["metadata"]["resourceVersion"] = api._next_version()
                    api.templates[(namespace, meta["name"])] = body
                self._send(201, body)

            def _store_slice(self, name: str, body: dict[str, Any], verb: str) -> None:
                try:
                    validate(body)
                except Exception as e:  # the real API server refuses it; so do we, and the test sees why
                    api.invalid.append(str(e))
                    return self._send(422, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 422,
                                            "reason": "Invalid", "message": str(e)[:500]})  # fmt: skip
                with api._lock:
                    body["metadata"]["resourceVersion"] = api._next_version()
                    api.slices[name] = body
                    api.writes.append((verb, name))
                self._send(201 if verb == "create" else 200, body)

            def do_POST(self) -> None:
                m = re.fullmatch(BASE + r"/namespaces/([^/]+)/resourceclaimtemplates", self.path.split("?")[0])
                if m:
                    return self._create_template(m.group(1))
                if self.path.split("?")[0] != BASE + "/resourceslices":
                    return self._missing()
                body = self._body()
                if body["metadata"]["name"] in api.slices:
                    return self._send(409, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 409,
                                            "reason": "AlreadyExists"})  # fmt: skip
                self._store_slice(body["metadata"]["name"], body, "create")

            def do_PATCH(self) -> None:
                path = self.path.split("?")[0]
                node = re.fullmatch(r"/api/v1/nodes/([^/?]+)", path)
                template = re.fullmatch(BASE + r"/namespaces/([^/]+)/resourceclaimtemplates/([^/?]+)", path)
                if not (node and node.group(1) in api.nodes) and not (template and template.groups() in api.templates):
                    return self._missing()
                if self.headers.get("Content-Type") != "application/merge-patch+json":
                    return self._status(415, "UnsupportedMediaType", f"this stand-in takes merge patches, not "
                                                                     f"{self.headers.get('Content-Type')}")  # fmt: skip
                if template:
                    return self._patch_template(template.group(1), template.group(2))
                with api._lock:
                    patched = merge_patch(api.nodes[node.group(1)], self._body())
                    try:
                        validate(patched)
                    except Exception as e:
                        api.invalid.append(str(e))
                        return self._status(422, "Invalid", str(e)[:500])
                    patched["metadata"]["resourceVersion"] = api._next_version()
                    api.nodes[node.group(1)] = patched
                    api.node_patches += 1
                self._send(200, patched)

            def _patch_template(self, namespace: str, name: str) -> None:
                if api.refuse_template_patches is not None:
                    return self._status(api.refuse_template_patches, "Forbidden", "patch is forbidden")
                body = self._body()
                with api._lock:
                    there = api.templates[(namespace, name)]
                    asked = (body.get("metadata") or {}).get("resourceVersion")
                    if asked is not None and asked != there["metadata"].get("resourceVersion"):
                        return self._status(409, "Conflict", "the object has been modified")
                    patched = merge_patch(there, body)
                    try:
                        validate(patched)
                    except Exception as e:
                        api.invalid.append(str(e))
                        return self._status(422, "Invalid", str(e)[:500])
                    patched["metadata"]["resourceVersion"] = api._next_version()
                    api.templates[(namespace, name)] = patched
                    api.template_patches.append((namespace, name))
                self._send(200, patched)

            def do_PUT(self) -> None:
                m = re.fullmatch(BASE + r"/resourceslices/([^/?]+)", self.path.split("?")[0])
                if not m or m.group(1) not in api.slices:
                    return self._missing()
                body = self._body()
                if body["metadata"].get("resourceVersion") != api.slices[m.group(1)]["metadata"]["resourceVersion"]:
                    return self._send(
                        409,
                        {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 409, "reason": "Conflict"},
                    )
                self._store_slice(m.group(1), body, "replace")

        return Handler

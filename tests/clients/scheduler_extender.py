"""kube-scheduler's side of the extender contract, as the real one calls an
extender (kubernetes/kubernetes pkg/scheduler/extender.go, HTTPExtender), with
the types of staging/src/k8s.io/kube-scheduler/extender/v1/types.go declared
below. No registry we can reach ships that Go module, so the declaration is
ours, written from the file and cited; the Pod and Node objects that travel
in it are checked against the official Kubernetes schemas
(kubernetes-validate).

What this follows:
- IsInterested: an extender with managedResources is called only for pods
  whose containers or init containers name one in requests or limits;
- Filter and Prioritize: ExtenderArgs {Pod, Nodes, NodeNames} marshalled by
  encoding/json (no json tags: the keys are the Go field names), Nodes a
  NodeList when nodeCacheCapable is false; POST to urlPrefix/verb with
  Content-Type application/json; a status other than 200 fails the call
  ("failed <verb> with extender at URL ..., code N");
- the reply decoded by encoding/json: keys matched to fields case-insensitively,
  unknown keys ignored, a value of the wrong type an error;
- Filter: a non-empty Error fails; with nodeCacheCapable false the nodes kept
  are result.Nodes.Items (a missing Nodes keeps none); FailedNodes and
  FailedAndUnresolvableNodes come back as they are;
- Prioritize: the HostPriorityList and the extender's weight."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import kubernetes_validate

MAX_EXTENDER_PRIORITY = 10  # extender/v1 MaxExtenderPriority
K8S_VERSION = "1.35"  # the newest the device plugin path is meant for

# extender/v1 types.go, field by field: Go type as a Python check
STRING_MAP = "map[string]string"
EXTENDER_FILTER_RESULT = {
    "Nodes": "*v1.NodeList",
    "NodeNames": "*[]string",
    "FailedNodes": STRING_MAP,
    "FailedAndUnresolvableNodes": STRING_MAP,
    "Error": "string",
}
HOST_PRIORITY = {"Host": "string", "Score": "int64"}


class ExtenderError(Exception):
    """What kube-scheduler would log and fail the pod's scheduling cycle with."""


def _typed(go: str, value: Any, where: str) -> Any:
    if value is None and go.startswith(("*", "map[")):
        return None
    ok = {
        "string": isinstance(value, str),
        "int64": isinstance(value, int) and not isinstance(value, bool),
        STRING_MAP: isinstance(value, dict) and all(isinstance(v, str) for v in value.values()),
        "*[]string": isinstance(value, list) and all(isinstance(v, str) for v in value),
        "*v1.NodeList": isinstance(value, dict) and isinstance(value.get("items", []), list),
    }[go]
    if not ok:
        raise ExtenderError(f"json: cannot unmarshal {type(value).__name__} into Go struct field {where} of type {go}")
    return value


def _decode(fields: dict[str, str], raw: Any, what: str) -> dict[str, Any]:
    """encoding/json into a struct: case-insensitive keys, unknown keys ignored, zero values for the rest."""
    if not isinstance(raw, dict):
        raise ExtenderError(f"json: cannot unmarshal {type(raw).__name__} into Go value of type {what}")
    out: dict[str, Any] = {f: None for f in fields}
    by_lower = {f.lower(): f for f in fields}
    for key, value in raw.items():
        field = by_lower.get(key.lower())
        if field is not None:
            out[field] = _typed(fields[field], value, f"{what}.{field}")
    return out


@dataclass
class Scheduler:
    """One extender entry of a KubeSchedulerConfiguration, as kube-scheduler uses it."""

    url_prefix: str
    managed_resources: tuple[str, ...]
    filter_verb: str = "filter"
    prioritize_verb: str = "prioritize"
    weight: int = 1
    node_cache_capable: bool = False
    timeout_s: float = 5.0  # DefaultExtenderTimeout

    def is_interested(self, pod: dict[str, Any]) -> bool:
        if not self.managed_resources:
            return True
        spec = pod.get("spec") or {}
        for c in [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]:
            res = c.get("resources") or {}
            if any(r in self.managed_resources for part in ("requests", "limits") for r in (res.get(part) or {})):
                return True
        return False

    def _send(self, verb: str, args: dict[str, Any]) -> Any:
        url = self.url_prefix.rstrip("/") + "/" + verb
        req = urllib.request.Request(
            url, data=json.dumps(args).encode(), method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise ExtenderError(f"failed {verb} with extender at URL {url}, code {e.code}") from e

    def _args(self, pod: dict[str, Any], nodes: list[dict[str, Any]]) -> dict[str, Any]:
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
        for n in nodes:
            kubernetes_validate.validate(n, K8S_VERSION, strict=True)
        if self.node_cache_capable:
            return {"Pod": pod, "Nodes": None, "NodeNames": [n["metadata"]["name"] for n in nodes]}
        return {"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}

    def filter(
        self, pod: dict[str, Any], nodes: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], dict[str, str], dict[str, str]]:
        """(nodes kept, FailedNodes, FailedAndUnresolvableNodes); raises ExtenderError."""
        if not self.is_interested(pod):
            return nodes, {}, {}
        given = {n["metadata"]["name"] for n in nodes}
        result = _decode(
            EXTENDER_FILTER_RESULT, self._send(self.filter_verb, self._args(pod, nodes)), "v1.ExtenderFilterResult"
        )
        if result["Error"]:
            raise ExtenderError(result["Error"])
        if self.node_cache_capable and result["NodeNames"] is not None:
            kept_names = result["NodeNames"]
            by_name = {n["metadata"]["name"]: n for n in nodes}
            missing = [n for n in kept_names if n not in by_name]
            if missing:
                raise ExtenderError(f"extender claims a filtered node {missing[0]!r} which is not in the input")
            kept = [by_name[n] for n in kept_names]
        elif result["Nodes"] is not None:
            kept = list(result["Nodes"].get("items") or [])
            for n in kept:
                kubernetes_validate.validate(n, K8S_VERSION, strict=True)  # decoded into v1.Node
        else:
            kept = []
        assert {n["metadata"]["name"] for n in kept} <= given, "a filter keeps a subset of what it was given"
        return kept, result["FailedNodes"] or {}, result["FailedAndUnresolvableNodes"] or {}

    def prioritize(self, pod: dict[str, Any], nodes: list[dict[str, Any]]) -> tuple[dict[str, int], int]:
        """({host: score}, weight); raises ExtenderError."""
        raw = self._send(self.prioritize_verb, self._args(pod, nodes))
        if not isinstance(raw, list):
            raise ExtenderError(
                f"json: cannot unmarshal {type(raw).__name__} into Go value of type v1.HostPriorityList"
            )
        scores = {}
        for item in raw:
            hp = _decode(HOST_PRIORITY, item, "v1.HostPriority")
            scores[hp["Host"] or ""] = hp["Score"] or 0
        return scores, self.weight

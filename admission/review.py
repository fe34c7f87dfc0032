"""The answer to an AdmissionReview (admission.k8s.io/v1) for a pod: allowed,
with the JSONPatch that rewrites it (admission/rewrite.py); allowed and
untouched when it asks neither HAMi nor Volcano for GPUs; refused, with one
line saying what cannot be asked of gpuslice and what can, otherwise.

The request and response follow the API's types (k8s.io/api/admission/v1:
AdmissionReview{apiVersion, kind, request, response}; AdmissionResponse{uid,
allowed, status, patch (base64 of the JSON Patch), patchType "JSONPatch"})."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuslice import errors
from gpuslice.admission import hami
from gpuslice.admission.rewrite import rewrite

API_VERSION = "admission.k8s.io/v1"


# mode dra: writes a rewritten pod's ResourceClaimTemplates into its namespace (namespace, templates,
# dry run); admission/templates.py
Templates = Callable[[str, list[dict[str, Any]], bool], None]


@dataclass(frozen=True)
class Settings:
    mode: str  # the chart's: devicePlugin, runtimeClass or dra
    names: tuple[hami.Names, ...] = (hami.HAMI, hami.VOLCANO)
    schedulers: dict[str, str] = field(default_factory=dict)  # a pod's schedulerName (HAMi's) -> the one it gets
    largest_gpu_mib: Callable[[], int] = field(default=lambda: 0)  # the most a vGPU may ask; 0: not known here
    templates: Templates | None = None  # None: no access to the API server


def _refused(uid: str, code: int, message: str) -> dict[str, Any]:
    reason = "BadRequest" if code == 400 else "ServiceUnavailable"
    return _review(uid, {"allowed": False, "status": {"status": "Failure", "code": code, "reason": reason,
                                                      "message": f"gpuslice: {message}"}})  # fmt: skip


def _write_templates(request: dict[str, Any], pod: dict[str, Any], templates: list[dict[str, Any]],
                     settings: Settings) -> None:  # fmt: skip
    """The pod's templates in its namespace before it is let through (not for a dry run's pod)."""
    if not templates:
        return
    if settings.templates is None:
        raise errors.FailedPrecondition("mode dra writes each rewritten pod's ResourceClaimTemplate through the API "
                                        "server, and this webhook runs without it (--no-api)")  # fmt: skip
    namespace = request.get("namespace") or (pod.get("metadata") or {}).get("namespace")
    if not namespace:
        raise errors.InvalidArgument("a pod without a namespace; accepted: a pod of a namespace")
    settings.templates(str(namespace), templates, bool(request.get("dryRun")))


def _review(uid: str, response: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": {"uid": uid, **response}}


def answer(body: Any, settings: Settings) -> dict[str, Any]:
    """The AdmissionReview to send back for `body` (parsed JSON)."""
    request = body.get("request") if isinstance(body, dict) else None
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str):
        raise errors.InvalidArgument("not an AdmissionReview: accepted a JSON object with request.uid (admission/v1)")
    uid = request["uid"]
    pod = request.get("object")
    kind = (request.get("kind") or {}).get("kind")
    if kind != "Pod" or not isinstance(pod, dict) or request.get("operation", "CREATE") != "CREATE":
        return _review(uid, {"allowed": True})  # only a pod's creation is rewritten
    try:
        done = rewrite(pod, settings.mode, settings.names, settings.schedulers, settings.largest_gpu_mib())
    except errors.InvalidArgument as e:
        return _refused(uid, 400, str(e))
    try:
        _write_templates(request, pod, done.templates, settings)
    except errors.InvalidArgument as e:
        return _refused(uid, 400, str(e))
    except errors.GpusliceError as e:  # the API server away or refusing: the pod is not let through half done
        return _refused(uid, 503, str(e))
    if not done.patch:
        return _review(uid, {"allowed": True})
    patch = base64.b64encode(json.dumps(done.patch, separators=(",", ":")).encode()).decode()
    return _review(uid, {"allowed": True, "patchType": "JSONPatch", "patch": patch})

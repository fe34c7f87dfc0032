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


@dataclass(frozen=True)
class Settings:
    mode: str  # the chart's: devicePlugin or runtimeClass
    names: tuple[hami.Names, ...] = (hami.HAMI, hami.VOLCANO)
    schedulers: dict[str, str] = field(default_factory=dict)  # a pod's schedulerName (HAMi's) -> the one it gets
    largest_gpu_mib: Callable[[], int] = field(default=lambda: 0)  # the most a vGPU may ask; 0: not known here


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
        return _review(uid, {"allowed": False, "status": {"status": "Failure", "code": 400, "reason": "BadRequest",
                                                          "message": f"gpuslice: {e}"}})  # fmt: skip
    if not done.patch:
        return _review(uid, {"allowed": True})
    patch = base64.b64encode(json.dumps(done.patch, separators=(",", ":")).encode()).decode()
    return _review(uid, {"allowed": True, "patchType": "JSONPatch", "patch": patch})

"""A ResourceClaim as kube-scheduler allocated it, read for this driver and
this node: one Result per allocation result (a device, the request it
answers, its share ID and consumedCapacity, admin access), each with the
opaque configuration for `gpuslice.io` that applies to its request."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpuslice import errors, request
from gpuslice.dra.resource_slice import DRIVER

CONFIG_API_VERSION = "gpuslice.io/v1"
CONFIG_KIND = "SliceConfig"
CONFIG_KEYS = {"apiVersion", "kind", "computePolicy", "priority", "wholeGPU"}
_QUANTITY = re.compile(r"^([0-9]+)(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?\Z", re.ASCII)
_FACTORS = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50,
            "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}  # fmt: skip


class ClaimError(errors.InvalidArgument):
    """What is wrong with a claim, one line."""


@dataclass(frozen=True)
class Config:
    """The opaque parameters that apply to one result."""

    policy: str | None = None
    priority: str | None = None
    whole: bool = False  # wholeGPU: true: the result must have consumed the whole GPU


@dataclass(frozen=True)
class Result:
    """One allocation result for a device of ours."""

    request: str  # as allocated: "<request>" or "<request>/<subrequest>"
    pool: str
    device: str
    memory: int | None  # consumedCapacity; None: none consumed (an exclusive device: the whole GPU)
    cores: int | None
    share_id: str | None
    admin: bool = False  # adminAccess: monitoring, books nothing
    config: Config = Config()
    tolerations: tuple[dict[str, Any], ...] = ()  # its request's device tolerations

    @property
    def base_request(self) -> str:
        """The request a container names (resources.claims[].request): a
        subrequest's parent (k8s.io/dynamic-resource-allocation/resourceclaim
        BaseRequestRef)."""
        return self.request.split("/", 1)[0]

    @property
    def share(self) -> str:
        """Tells the claim's shares apart: the share ID, else the request and device."""
        return self.share_id or f"{self.request.replace('/', '.')}@{self.device}"


@dataclass(frozen=True)
class Claim:
    uid: str
    namespace: str
    name: str
    results: tuple[Result, ...]


def quantity(text: object, what: str) -> int:
    """A whole Kubernetes quantity ("4Gi", "30", "4294967296")."""
    m = _QUANTITY.match(str(text))
    if not m:
        raise ClaimError(f"{what} {text!r} is not a whole quantity (a number with Ki, Mi, Gi, Ti, k, M, G or T)")
    return int(m.group(1)) * _FACTORS[m.group(2)]


def _params(entry: dict[str, Any]) -> dict[str, Any] | None:
    """An entry's parameters for our driver, checked; None for another driver's."""
    opaque = entry.get("opaque") or {}
    if opaque.get("driver") != DRIVER:
        return None
    params = opaque.get("parameters") or {}
    unknown = set(params) - CONFIG_KEYS
    if unknown or params.get("apiVersion", CONFIG_API_VERSION) != CONFIG_API_VERSION:
        raise ClaimError(
            f"opaque config for {DRIVER}: unknown {sorted(unknown) or params.get('apiVersion')}; accepted: "
            f"apiVersion {CONFIG_API_VERSION}, kind {CONFIG_KIND}, computePolicy (hard, elastic), "
            "priority (high, normal, low), wholeGPU (true, false)"
        )
    if not isinstance(params.get("wholeGPU", False), bool):
        raise ClaimError(f"wholeGPU {params['wholeGPU']!r}: accepted true, false")
    policy, priority = params.get("computePolicy"), params.get("priority")
    if policy is not None and policy not in {p.value for p in request.ComputePolicy}:
        raise ClaimError(f"computePolicy {policy!r}: accepted hard, elastic")
    if priority is not None and priority not in {p.value for p in request.Priority}:
        raise ClaimError(f"priority {priority!r}: accepted high, normal, low")
    return params


def _applies(requests: list[str], result_request: str) -> bool:
    """Whether a config entry applies to a result: no requests (all of them),
    the result's own request, or its parent request (as
    k8s.io/dynamic-resource-allocation/resourceclaim ConfigForResult matches)."""
    return not requests or result_request in requests or result_request.split("/", 1)[0] in requests


def _config(entries: list[tuple[list[str], dict[str, Any]]], result_request: str) -> Config:
    """The parameters for one result: later entries over earlier ones, the
    claim's over its class's."""
    merged: dict[str, Any] = {}
    for requests, params in entries:
        if _applies(requests, result_request):
            merged.update({k: v for k, v in params.items() if k in ("computePolicy", "priority", "wholeGPU")})
    return Config(merged.get("computePolicy"), merged.get("priority"), merged.get("wholeGPU", False))


def request_tolerations(claim: dict[str, Any]) -> dict[str, tuple[dict[str, Any], ...]]:
    """Each request's device tolerations by the name a result gives ("<request>" or
    "<request>/<subrequest>"): resource.k8s.io/v1 keeps them under `exactly` and each
    `firstAvailable` entry; v1beta1 on the request itself."""
    out: dict[str, tuple[dict[str, Any], ...]] = {}
    for req in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        name = req.get("name", "")
        out[name] = tuple((req.get("exactly") or req).get("tolerations") or ())
        for sub in req.get("firstAvailable") or []:
            out[f"{name}/{sub.get('name', '')}"] = tuple(sub.get("tolerations") or ())
    return out


def tolerates(tolerations: tuple[dict[str, Any], ...], key: str, effect: str, value: str = "") -> bool:
    """Whether any toleration matches the taint <key, value, effect>, as resource.k8s.io's
    DeviceToleration defines it: an empty key with Exists matches every key; Exists matches
    any value, Equal (the default) the same value; an empty effect matches every effect."""
    for t in tolerations:
        op = t.get("operator") or "Equal"
        key_ok = t.get("key", "") == key or (not t.get("key") and op == "Exists")
        value_ok = op == "Exists" or (t.get("value") or "") == value
        if key_ok and value_ok and (t.get("effect") or effect) == effect:
            return True
    return False


def _result(raw: dict[str, Any], config: Config, tolerations: tuple[dict[str, Any], ...] = ()) -> Result:
    consumed = raw.get("consumedCapacity") or {}
    unknown = set(consumed) - {"memory", "cores"}
    if unknown:
        raise ClaimError(f"device {raw['device']}: unknown consumed capacity {sorted(unknown)} (memory, cores)")
    memory = cores = None
    if consumed:  # the allocator writes every capacity of a shared device; one it left out is none of it
        memory = quantity(consumed.get("memory", 0), "memory")
        cores = quantity(consumed.get("cores", 0), "cores")
    return Result(raw["request"], raw["pool"], raw["device"], memory, cores, raw.get("shareID"),
                  bool(raw.get("adminAccess")), config, tolerations)  # fmt: skip


def _twice(results: list[Result]) -> None:
    """One request given one device twice: schedulers of Kubernetes 1.34 and
    1.35 do it for `count` > 1 on a shared device (fixed in 1.36); two shares
    on one GPU for one request are not what the claim asked for."""
    seen: set[tuple[str, str]] = set()
    for r in results:
        if (r.request, r.device) in seen:
            raise ClaimError(
                f"request {r.request} was given GPU {r.device} twice (a scheduler before Kubernetes 1.36 does this "
                "for count > 1); ask for count: 1 per request, or run Kubernetes 1.36 or later"
            )
        seen.add((r.request, r.device))


def parse(claim: dict[str, Any], pool: str) -> Claim:
    """The claim's allocation for DRIVER's devices in `pool` (this node)."""
    meta = claim.get("metadata") or {}
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError("not allocated")
    devices = allocation.get("devices") or {}
    ours = [r for r in devices.get("results") or [] if r.get("driver") == DRIVER]
    if not ours:
        raise ClaimError(f"no device of {DRIVER} allocated")
    elsewhere = sorted({r.get("pool", "") for r in ours} - {pool})
    if elsewhere:
        raise ClaimError(f"devices of pool {elsewhere[0]}, not of this node ({pool})")
    # the scheduler lists the class's entries before the claim's; sorted stably, so either way the claim's win
    entries = sorted(devices.get("config") or [], key=lambda e: e.get("source") == "FromClaim")
    checked = [(list(e.get("requests") or []), p) for e in entries if (p := _params(e)) is not None]
    tolerations = request_tolerations(claim)
    results = [_result(r, _config(checked, r["request"]), tolerations.get(r["request"], ())) for r in ours]
    _twice(results)
    return Claim(meta["uid"], meta.get("namespace", ""), meta.get("name", ""), tuple(results))

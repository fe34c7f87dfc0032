"""A ResourceClaim as kube-scheduler allocated it, read for this driver and
this node: which GPUs, how much of each (consumedCapacity), which share, and
the opaque configuration for `gpuslice.io` (compute policy, priority)."""

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
class Allocated:
    """One allocation result for a device of ours."""

    request: str
    pool: str
    device: str
    memory: int | None  # None: the request consumed no capacity (the whole device)
    cores: int | None
    share_id: str | None


@dataclass(frozen=True)
class Claim:
    uid: str
    namespace: str
    name: str
    devices: tuple[Allocated, ...]
    policy: str | None = None
    priority: str | None = None
    whole: bool = False  # the class asked for whole GPUs (wholeGPU: true): no memory limit, no share


def quantity(text: object, what: str) -> int:
    """A whole Kubernetes quantity ("4Gi", "30", "4294967296")."""
    m = _QUANTITY.match(str(text))
    if not m:
        raise ClaimError(f"{what} {text!r} is not a whole quantity (a number with Ki, Mi, Gi, Ti, k, M, G or T)")
    return int(m.group(1)) * _FACTORS[m.group(2)]


def _allocated(result: dict[str, Any]) -> Allocated:
    consumed = result.get("consumedCapacity") or {}
    unknown = set(consumed) - {"memory", "cores"}
    if unknown:
        raise ClaimError(f"device {result['device']}: unknown consumed capacity {sorted(unknown)} (memory, cores)")
    memory = quantity(consumed["memory"], "memory") if "memory" in consumed else None
    cores = quantity(consumed["cores"], "cores") if "cores" in consumed else None
    return Allocated(result["request"], result["pool"], result["device"], memory, cores, result.get("shareID"))


def _config(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The opaque parameters for our driver; the claim's own win over its class's."""
    merged: dict[str, Any] = {}
    for entry in sorted(entries, key=lambda e: e.get("source") == "FromClaim"):
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != DRIVER:
            continue
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
        merged.update({k: v for k, v in params.items() if k in ("computePolicy", "priority", "wholeGPU")})
    return merged


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
    config = _config(devices.get("config") or [])
    policy, priority = config.get("computePolicy"), config.get("priority")
    if policy is not None and policy not in {p.value for p in request.ComputePolicy}:
        raise ClaimError(f"computePolicy {policy!r}: accepted hard, elastic")
    if priority is not None and priority not in {p.value for p in request.Priority}:
        raise ClaimError(f"priority {priority!r}: accepted high, normal, low")
    return Claim(meta["uid"], meta.get("namespace", ""), meta.get("name", ""), tuple(_allocated(r) for r in ours),
                 policy, priority, config.get("wholeGPU", False))  # fmt: skip

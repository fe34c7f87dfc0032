"""Mode dra: a HAMi vGPU as the ResourceClaimTemplate a pod's claim is made
from (resource.k8s.io/v1), and HAMi's constraints on where a pod may run as
the CEL selectors of its request, which kube-scheduler evaluates against each
device the gpuslice.io driver publishes (dra/resource_slice.py: `uuid`,
`index`, `productName` under the driver's domain).

HAMi's meaning, which the selectors keep (its scheduler's checkGPUtype and
the UUID filters, pkg/device/nvidia/device.go): use-gputype passes a GPU
whose type contains one of the comma-separated words, ignoring case;
nouse-gputype passes one that contains none of them; use-gpuuuid and
use-gpuindexes pass one of the GPUs named, the nouse- forms none of them.

A template's name is its content's digest: every pod asking the same shape
in a namespace shares one template, and writing it twice is writing the same."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuslice import errors, request
from gpuslice.admission import hami
from gpuslice.dra.claims import CONFIG_API_VERSION, CONFIG_KIND
from gpuslice.dra.resource_slice import API_VERSION, DRIVER, NUMA_GROUP

# the chart's DeviceClasses (deploy/helm/gpuslice/templates/dra.yaml)
DEVICE_CLASS = "gpuslice.io"  # a share: memory and cores consumed from a GPU many claims share
WHOLE_CLASS = "whole.gpuslice.io"  # a whole GPU: the requestPolicy defaults, all of its memory
REQUEST = "gpu"
PREFIX = "gpuslice-hami-"
MANAGED_BY = "gpuslice-admission-webhook"  # app.kubernetes.io/managed-by on each template written

_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]{1,80}\Z", re.ASCII)
_ATTR = f'device.attributes["{DRIVER}"]'
NUMA_CONSTRAINT = f"matchAttribute {DRIVER}/{NUMA_GROUP}"  # the record's words for numa-bind's constraint


@dataclass(frozen=True)
class Placement:
    """Where HAMi's annotations let a pod's vGPUs be, checked once."""

    uuids: tuple[str, ...] = ()
    no_uuids: tuple[str, ...] = ()
    indexes: tuple[int, ...] = ()
    no_indexes: tuple[int, ...] = ()
    types: tuple[str, ...] = ()
    no_types: tuple[str, ...] = ()
    numa_bind: bool = False  # a container's several GPUs on one NUMA node (a constraint, not a selector)

    def selectors(self) -> list[dict[str, Any]]:
        """One CEL selector per constraint (the request takes a device only where all are true)."""
        # each value was checked (placement): no quote or backslash can be in one
        uuids = (", ".join(f'"{v}"' for v in said) for said in (self.uuids, self.no_uuids))
        indexes = (", ".join(map(str, said)) for said in (self.indexes, self.no_indexes))
        # RE2, case folded: "contains one of them, ignoring case"; of the characters a type may have
        # only the dot means anything in a pattern (its backslash doubled: inside a CEL string)
        types = ("|".join(v.replace(".", "\\\\.") for v in said) for said in (self.types, self.no_types))
        out = []
        for (use, avoid), form in ((uuids, "({a}.uuid in [{v}])"), (indexes, "({a}.index in [{v}])"),
                                   (types, '{a}.productName.matches("(?i)({v})")')):  # fmt: skip
            out += [("!" if negate else "") + form.format(a=_ATTR, v=v)
                    for v, negate in ((use, False), (avoid, True)) if v]  # fmt: skip
        return [{"cel": {"expression": e}} for e in out]


def placement(annotations: Mapping[str, Any]) -> Placement:
    """HAMi's use-/nouse- annotations of a pod, each value checked (one line naming it otherwise)."""

    def uuids(key: str) -> tuple[str, ...]:
        said = hami.listed(annotations, key)
        for u in said:
            if not _UUID.match(u):
                raise errors.InvalidArgument(f"annotation {key}: {u!r} is not a GPU's UUID; accepted: comma-"
                                             "separated UUIDs as nvidia-smi -L prints them (GPU-...)")  # fmt: skip
        return tuple(said)

    def indexes(key: str) -> tuple[int, ...]:
        said = hami.listed(annotations, key)
        for i in said:
            if not i.isdigit() or int(i) > 1023:
                raise errors.InvalidArgument(f"annotation {key}: {i!r} is not a GPU's index; accepted: "
                                             "comma-separated integers from 0")  # fmt: skip
        return tuple(int(i) for i in said)

    def types(key: str) -> tuple[str, ...]:
        said = hami.listed(annotations, key)
        for t in said:
            if not request.TYPE_WORD.match(t):
                raise errors.InvalidArgument(f"annotation {key}: {t!r} is not a GPU type; accepted: comma-"
                                             "separated words of a GPU's name (letters, digits, space, . _ -), "
                                             "such as A100")  # fmt: skip
        return tuple(said)

    return Placement(uuids(hami.USE_UUID), uuids(hami.NOUSE_UUID), indexes(hami.USE_INDEX),
                     indexes(hami.NOUSE_INDEX), types(hami.USE_TYPE), types(hami.NOUSE_TYPE),
                     bool(hami.numa_bind(annotations)))  # fmt: skip


def template(ask: hami.Ask, policy: str | None, priority: str | None, where: Placement, said: str) -> dict[str, Any]:
    """The ResourceClaimTemplate (no namespace: the pod's) of one container's vGPUs.
    `policy`: HAMi-core's utilization policy as gpuslice's (None: no share of compute)."""
    exactly: dict[str, Any] = {"deviceClassName": WHOLE_CLASS if ask.whole else DEVICE_CLASS}
    if ask.gpus != 1:
        exactly["count"] = ask.gpus
    if not ask.whole:
        if ask.memory_percent is not None:
            raise errors.InvalidArgument(f"{said}: {ask.names.memory_percentage} in dra mode, whose memory is a "
                                         "quantity of bytes; ask MiB, or use runtimeClass mode")  # fmt: skip
        if ask.memory_mib is None:
            raise errors.InvalidArgument(f"{said}: cores without memory; a slice holds memory: ask {ask.names.memory}")
        # the device's requestPolicy rounds it up to its 256 MiB steps: never less than asked
        requests = {"memory": f"{ask.memory_mib}Mi"}
        if ask.cores and policy is not None:
            requests["cores"] = str(ask.cores)
        exactly["capacity"] = {"requests": requests}
    if selectors := where.selectors():
        exactly["selectors"] = selectors
    devices: dict[str, Any] = {"requests": [{"name": REQUEST, "exactly": exactly}]}
    if ask.gpus > 1:  # vGPUs of one container on as many GPUs, as HAMi places them
        devices["constraints"] = [{"requests": [REQUEST], "distinctAttribute": f"{DRIVER}/uuid"}]
        if where.numa_bind:  # ... all of them on one NUMA node
            devices["constraints"].append({"requests": [REQUEST], "matchAttribute": f"{DRIVER}/{NUMA_GROUP}"})
    params: dict[str, Any] = {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND}
    if not ask.whole:  # a whole GPU's class says wholeGPU itself, and no share is held back
        if ask.cores and policy is not None:
            params["computePolicy"] = policy
        if priority is not None:
            params["priority"] = priority
    if len(params) > 2:
        devices["config"] = [{"requests": [REQUEST], "opaque": {"driver": DRIVER, "parameters": params}}]
    spec = {"spec": {"devices": devices}}
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": PREFIX + digest, "labels": {"app.kubernetes.io/managed-by": MANAGED_BY}},
        "spec": spec,
    }


def summary(tmpl: dict[str, Any]) -> dict[str, str]:
    """What a template asks, in one flat map (the pod's record of what it was rewritten to)."""
    devices = tmpl["spec"]["spec"]["devices"]
    exactly = devices["requests"][0]["exactly"]
    out = {"deviceClassName": exactly["deviceClassName"]}
    if "count" in exactly:
        out["count"] = str(exactly["count"])
    out.update((k, str(v)) for k, v in ((exactly.get("capacity") or {}).get("requests") or {}).items())
    for entry in devices.get("config") or []:
        out.update((k, str(v)) for k, v in entry["opaque"]["parameters"].items() if k not in ("apiVersion", "kind"))
    if selectors := exactly.get("selectors"):
        out["selectors"] = " && ".join(s["cel"]["expression"] for s in selectors)
    if same := [c["matchAttribute"] for c in devices.get("constraints") or [] if "matchAttribute" in c]:
        out["matchAttribute"] = ",".join(same)
    return out

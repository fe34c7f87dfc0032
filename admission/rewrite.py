"""A pod written for HAMi or Volcano's vGPU, rewritten as a JSONPatch into
the chart's mode, asking gpuslice for the same (admission/hami.py reads
what it asks). What was rewritten from what is recorded on the pod in one
annotation, so `kubectl describe` shows it.

- devicePlugin: each container's gpuslice.io/* extended resources: whole
  GPUs as gpuslice.io/gpu; a vGPU's memory as gpuslice.io/memory in the
  plugin's units (GiB, rounded up: never less than asked) and its cores as
  gpuslice.io/cores. A container's slice lies on one GPU, so more than one
  shared vGPU per container, or memory as a percentage (the units are
  bytes), is refused in one line.
- runtimeClass: the pod runs under the gpuslice RuntimeClass and each
  container asks in its own environment (GPUSLICE_GPUS, GPUSLICE_MEMORY in
  MiB or as a percentage, GPUSLICE_CORES), which the hook reads.
- dra: each container gets a claim of the pod, made from a
  ResourceClaimTemplate of the pod's namespace that asks the same
  (admission/claim_template.py; Rewrite.templates: the webhook writes them,
  admission/templates.py); HAMi's constraints on where the pod may run
  become the request's CEL selectors, so every one of them is served there.

In every mode HAMi's resources leave the container (nothing would serve
them), HAMi-core's utilization policy becomes the compute policy (default:
the share may be exceeded while the GPU is idle, elastic; force: hard;
disable: no share) and its priority gpuslice's. HAMi's constraints on the
GPUs a pod may run on (use-/nouse-gpuuuid, -gpuindexes, -gputype) become,
in devicePlugin and runtimeClass mode, each GPU container's GPU choice in
its environment (GPUSLICE_DEVICE, GPUSLICE_AVOID_DEVICE,
GPUSLICE_DEVICE_TYPE, GPUSLICE_AVOID_DEVICE_TYPE): the scheduler extender
places the pod by it, the device plugin and the daemon's placement give
only such GPUs, and the container's start refuses any other. HAMi's
per-pod gpu-scheduler-policy (binpack or spread: which of a node's GPUs
first) becomes GPUSLICE_GPU_POLICY there too. HAMi's numa-bind (a container's
GPUs on one NUMA node) becomes GPUSLICE_NUMA_BIND in runtimeClass mode (the
daemon's placement) and a matchAttribute constraint on the driver's numaGroup
in dra mode; in devicePlugin mode the kubelet picks whole GPUs, its Topology
Manager aligning them by each unit's NUMA node. A pod's schedulerName that
names HAMi's scheduler becomes the one the chart maps it to.

In dra mode, and for a gpu-scheduler-policy gpuslice has not, the policy
is left on the pod and the record says it was not translated: there
kube-scheduler's own scoring places the claims."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuslice import errors, request
from gpuslice.admission import claim_template, hami
from gpuslice.admission.options import MODES
from gpuslice.device_plugin.options import NODE_POLICY, POLICIES

# what the webhook rewrote, from what (JSON): for people (kubectl describe), not a request, so not under
# gpuslice.io/, which the runtime copies from a pod into each of its containers (pod_annotations) and whose
# every key the request parser reads: under it, every pod rewritten for runtimeClass mode failed to start
RECORD = "admission.gpuslice.io/rewritten-from"
RUNTIME_CLASS = "gpuslice"
HAMI_POLICY_ENV = "GPU_CORE_UTILIZATION_POLICY"  # HAMi-core: default, force, disable


def _escape(key: str) -> str:
    """A JSON Pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


@dataclass
class Rewrite:
    patch: list[dict[str, Any]] = field(default_factory=list)
    record: dict[str, Any] = field(default_factory=dict)
    templates: list[dict[str, Any]] = field(default_factory=list)  # mode dra: to be in the pod's namespace first
    claims: list[dict[str, Any]] = field(default_factory=list)  # mode dra: the pod's resourceClaims to add


def _policy(container: dict[str, Any]) -> str | None:
    env = {e.get("name"): e.get("value") for e in container.get("env") or [] if isinstance(e, dict)}
    said = str(env.get(HAMI_POLICY_ENV) or "default").strip().lower()
    return {"default": "elastic", "force": "hard", "disable": None}.get(said, "elastic")


def _asks(pod: dict[str, Any], names: tuple[hami.Names, ...]) -> list[tuple[int, dict, hami.Ask]]:
    found = []
    for i, c in enumerate((pod.get("spec") or {}).get("containers") or []):
        limits = (c.get("resources") or {}).get("limits") or {}
        for n in names:
            ask = hami.read(limits, n)
            if ask is not None:
                found.append((i, c, ask))
                break
    return found


def _remove_theirs(i: int, container: dict[str, Any], ask: hami.Ask) -> list[dict[str, Any]]:
    n = ask.names
    ops = []
    for part in ("limits", "requests"):
        have = (container.get("resources") or {}).get(part) or {}
        for key in (n.count, n.memory, n.memory_percentage, n.cores, n.priority):
            if key and key in have:
                ops.append({"op": "remove", "path": f"/spec/containers/{i}/resources/{part}/{_escape(key)}"})
    return ops


def _env_ops(i: int, container: dict[str, Any], env: dict[str, str]) -> list[dict[str, Any]]:
    if not env:
        return []
    entries = [{"name": k, "value": v} for k, v in env.items()]
    if not container.get("env"):
        return [{"op": "add", "path": f"/spec/containers/{i}/env", "value": entries}]
    return [{"op": "add", "path": f"/spec/containers/{i}/env/-", "value": e} for e in entries]


def _device_plugin(i: int, ask: hami.Ask, said: str) -> tuple[list[dict], dict[str, str]]:
    limits: dict[str, str] = {}
    if ask.whole:  # a count alone, or all of each GPU's memory
        limits["gpuslice.io/gpu"] = str(ask.gpus)
    else:
        if ask.gpus != 1:
            raise errors.InvalidArgument(f"{said}: {ask.gpus} shared vGPUs; in devicePlugin mode a container's slice "
                                         "lies on one GPU: ask 1, or whole GPUs (the count alone)")  # fmt: skip
        if ask.memory_percent is not None:
            raise errors.InvalidArgument(f"{said}: {ask.names.memory_percentage} in devicePlugin mode, whose memory "
                                         "is counted in GiB; ask MiB, or use runtimeClass mode")  # fmt: skip
        units = hami.memory_units(ask)
        if units is None:
            raise errors.InvalidArgument(f"{said}: cores without memory; a slice holds memory: ask {ask.names.memory}")
        limits["gpuslice.io/memory"] = str(units)
        if ask.cores:
            limits["gpuslice.io/cores"] = str(ask.cores)
    # the container's limits hold HAMi's (how it was found): they stay, less those, plus ours
    ops: list[dict[str, Any]] = [
        {"op": "add", "path": f"/spec/containers/{i}/resources/limits/{_escape(k)}", "value": v}
        for k, v in limits.items()
    ]
    return ops, limits


def _runtime_class(ask: hami.Ask, said: str) -> dict[str, str]:
    env = {"GPUSLICE_GPUS": str(ask.gpus)}
    if ask.whole:
        return env  # whole GPUs: the count alone
    if ask.memory_mib is not None:
        env["GPUSLICE_MEMORY"] = f"{ask.memory_mib}Mi"
    elif ask.memory_percent is not None:
        env["GPUSLICE_MEMORY"] = f"{ask.memory_percent}%"
    if ask.cores:
        env["GPUSLICE_CORES"] = str(ask.cores)
    return env


def _as_the_plugin_reads_it(env: dict[str, str], said: str) -> None:
    """A device plugin container's environment as the plugin, the extender and its start read it:
    what they would refuse (a GPU choice that is no UUID, index or word of a GPU's name) is refused now."""
    try:
        request.read_compute(request.gather({}, [f"{k}={v}" for k, v in env.items()]))
    except request.RequestError as e:
        raise errors.InvalidArgument(f"{said}, asked of gpuslice: {e}") from e


def _as_the_hook_reads_it(env: dict[str, str], said: str) -> None:
    """The container's request parsed by gpuslice's one parser, as the hook will at its start:
    what it would refuse then (a pin that is no GPU's UUID or index, more GPUs than pinned) is
    refused now."""
    try:
        request.read(request.gather({}, [f"{k}={v}" for k, v in env.items()]))
    except request.RequestError as e:
        raise errors.InvalidArgument(f"{said}, asked of gpuslice: {e}") from e


def _choice_env(annotations: Mapping[str, Any]) -> dict[str, str]:
    """HAMi's constraints on the GPUs a pod's vGPUs may be on, as each of its GPU containers' environment
    says them to gpuslice: a pod annotation would reach its sidecars too."""
    said = {
        request.DEVICE: [v for key in hami.PINS for v in hami.listed(annotations, key)],
        request.AVOID_DEVICE: [v for key in (hami.NOUSE_UUID, hami.NOUSE_INDEX) for v in hami.listed(annotations, key)],
        request.DEVICE_TYPE: hami.listed(annotations, hami.USE_TYPE),
        request.AVOID_DEVICE_TYPE: hami.listed(annotations, hami.NOUSE_TYPE),
        request.GPU_POLICY: [p] if (p := _placement_policy(annotations, hami.POLICY)) else [],
    }
    return {request.env_name(k): ",".join(v) for k, v in said.items() if v}


def _refuse_mig(annotations: Mapping[str, Any]) -> None:
    """HAMi's vgpu-mode mig asks a MIG instance, which gpuslice does not give: a slice is time and a
    memory limit on a whole GPU's SMs, not an instance's own. Refused rather than served otherwise."""
    mode = str(annotations.get(hami.VGPU_MODE) or "").strip().lower()
    if mode and mode != "hami-core":
        raise errors.InvalidArgument(f"{hami.VGPU_MODE}: {mode!r}: gpuslice shares a GPU by time and memory "
                                     "limits, not by MIG instances; accepted: hami-core, or no such "
                                     "annotation")  # fmt: skip


def _placement_policy(annotations: Mapping[str, Any], key: str) -> str | None:
    """HAMi's per-pod gpu- or node-scheduler-policy where gpuslice has it (binpack, spread); None: not
    said, or a policy of HAMi's that gpuslice has not (left on the pod, not translated)."""
    said = str(annotations.get(key) or "").strip().lower()
    return said if said in POLICIES else None


def rewrite(
    pod: dict[str, Any],
    mode: str,
    names: tuple[hami.Names, ...] = (hami.HAMI, hami.VOLCANO),
    schedulers: Mapping[str, str] | None = None,
    largest_gpu_mib: int = 0,
) -> Rewrite:
    """The JSONPatch that makes `pod` ask gpuslice, in `mode`; empty when it
    asks neither layer for GPUs. `schedulers` maps a schedulerName the pod
    gives (HAMi's) to the one it gets; `largest_gpu_mib`, where given, is the
    most memory a vGPU may ask (the cluster's largest GPU)."""
    if mode not in MODES:
        raise errors.InvalidArgument(f"mode {mode!r}; accepted: {', '.join(MODES)}")
    out = Rewrite()
    asks = _asks(pod, names)
    if not asks:
        return out
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    _refuse_mig(annotations)
    choice = _choice_env(annotations) if mode != "dra" else {}
    bind = hami.numa_bind(annotations)
    if bind and mode == "runtimeClass":  # the daemon places a slice's GPUs (devicePlugin: the kubelet does)
        choice[request.env_name(request.NUMA_BIND)] = "true"
    where = claim_template.placement(annotations) if mode == "dra" else None
    taken = {str(pc.get("name")) for pc in (pod.get("spec") or {}).get("resourceClaims") or [] if isinstance(pc, dict)}
    for i, c, ask in asks:
        _rewrite_container(out, i, c, ask, mode, choice, largest_gpu_mib, where, taken)
    out.patch += _claim_ops(pod, out.claims)
    if mode == "runtimeClass":
        out.patch.append({"op": "add", "path": "/spec/runtimeClassName", "value": RUNTIME_CLASS})
    scheduler = (pod.get("spec") or {}).get("schedulerName")
    if scheduler and schedulers and scheduler in schedulers:
        out.patch.append({"op": "replace", "path": "/spec/schedulerName", "value": schedulers[scheduler]})
        out.record["schedulerName"] = {"from": scheduler, "to": schedulers[scheduler]}
    if annotations.get(hami.POLICY):
        # each GPU container's GPUSLICE_GPU_POLICY outside dra mode; in it, kube-scheduler's own scoring places claims
        env = request.env_name(request.GPU_POLICY)
        out.record[hami.POLICY] = {"from": str(annotations[hami.POLICY]), "to": env if env in choice else None}
    extra = {}
    node_policy = _placement_policy(annotations, hami.NODE_POLICY)
    if node_policy and mode == "devicePlugin":  # the extender's mode
        extra[NODE_POLICY] = node_policy
        out.record[hami.NODE_POLICY] = {"from": str(annotations[hami.NODE_POLICY]), "to": NODE_POLICY}
    if bind is not None and mode in ("runtimeClass", "dra"):
        to = request.env_name(request.NUMA_BIND) if mode == "runtimeClass" else claim_template.NUMA_CONSTRAINT
        out.record[hami.NUMA_BIND] = {"from": str(annotations[hami.NUMA_BIND]), "to": to if bind else None}
    # not translated: in devicePlugin mode the kubelet picks a container's whole GPUs (its Topology Manager
    # aligns them by the NUMA node each device's topology names); elsewhere no choice among nodes is gpuslice's
    for key in (hami.NODE_POLICY, hami.NUMA_BIND, hami.VGPU_MODE):
        if annotations.get(key) and key not in out.record:
            out.record[key] = {"from": str(annotations[key]), "to": None}
    extra[RECORD] = json.dumps(out.record, sort_keys=True, separators=(",", ":"))
    if not (pod.get("metadata") or {}).get("annotations"):
        out.patch.append({"op": "add", "path": "/metadata/annotations", "value": extra})
    else:
        out.patch += [
            {"op": "add", "path": f"/metadata/annotations/{_escape(k)}", "value": v} for k, v in extra.items()
        ]
    return out


def _claim_ops(pod: dict[str, Any], claims: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pod's new resourceClaims, after those it has."""
    if not claims:
        return []
    if not (pod.get("spec") or {}).get("resourceClaims"):
        return [{"op": "add", "path": "/spec/resourceClaims", "value": claims}]
    return [{"op": "add", "path": "/spec/resourceClaims/-", "value": c} for c in claims]


def _dra(out: Rewrite, i: int, c: dict[str, Any], ask: hami.Ask, where: claim_template.Placement,
         taken: frozenset[str] | set[str], said: str) -> dict[str, str]:  # fmt: skip
    """A container's claim in mode dra: the pod claims it from a template of its namespace, and the
    container uses that claim. What it now asks, for the record."""
    policy = None if ask.whole else _policy(c)
    priority = None if ask.whole else hami.priority_word(ask)
    tmpl = claim_template.template(ask, policy, priority, where, said)
    name = tmpl["metadata"]["name"]
    if all(t["metadata"]["name"] != name for t in out.templates):
        out.templates.append(tmpl)
    # a pod's claim name is a DNS label: its container's index, not its name (which may be 63 long)
    claim = f"gpuslice-{i}"
    if claim in taken:
        raise errors.InvalidArgument(f"{said}: the pod has a claim named {claim} already; accepted: a pod whose "
                                     "own claims are not named gpuslice-<container index>")  # fmt: skip
    out.claims.append({"name": claim, "resourceClaimTemplateName": name})
    if (c.get("resources") or {}).get("claims"):
        out.patch.append({"op": "add", "path": f"/spec/containers/{i}/resources/claims/-", "value": {"name": claim}})
    else:
        out.patch.append({"op": "add", "path": f"/spec/containers/{i}/resources/claims", "value": [{"name": claim}]})
    return {"resourceClaimTemplate": name, **claim_template.summary(tmpl)}


def _rewrite_container(out: Rewrite, i: int, c: dict[str, Any], ask: hami.Ask, mode: str, choice: dict[str, str],
                       largest_gpu_mib: int, where: claim_template.Placement | None = None,
                       taken: frozenset[str] | set[str] = frozenset()) -> None:  # fmt: skip
    """One container's part of the patch, and its record (what it asked, what it asks now)."""
    said = f"container {c.get('name', i)}"
    if largest_gpu_mib and ask.memory_mib is not None and ask.memory_mib > largest_gpu_mib:
        raise errors.InvalidArgument(f"{said}: {ask.names.memory} {ask.memory_mib} MiB is more than this "
                                     f"cluster's largest GPU has; accepted: up to {largest_gpu_mib}")  # fmt: skip
    out.patch += _remove_theirs(i, c, ask)
    if mode == "dra":
        assert where is not None
        out.record[c.get("name", str(i))] = {"from": _theirs(c, ask), "to": _dra(out, i, c, ask, where, taken, said)}
        return
    env: dict[str, str] = {}
    if mode == "devicePlugin":
        ops, asked = _device_plugin(i, ask, said)
        out.patch += ops
    else:
        env = _runtime_class(ask, said)
        asked = dict(env)
    if not ask.whole:
        policy = _policy(c)
        if policy is None:
            env.pop("GPUSLICE_CORES", None)
            asked.pop("gpuslice.io/cores", None)
            out.patch = [op for op in out.patch if not op["path"].endswith(_escape("gpuslice.io/cores"))]
        elif ask.cores:
            env["GPUSLICE_COMPUTE_POLICY"] = policy
        if (word := hami.priority_word(ask)) is not None:
            env["GPUSLICE_PRIORITY"] = word
    env.update(choice)
    if mode == "devicePlugin":
        env.pop("GPUSLICE_GPUS", None)
        _as_the_plugin_reads_it(env, said)
    else:
        _as_the_hook_reads_it(env, said)
    out.patch += _env_ops(i, c, env)
    out.record[c.get("name", str(i))] = {"from": _theirs(c, ask), "to": {**asked, **env}}


def _theirs(c: dict[str, Any], ask: hami.Ask) -> dict[str, str]:
    limits = (c.get("resources") or {}).get("limits") or {}
    n = ask.names
    return {k: str(limits[k]) for k in (n.count, n.memory, n.memory_percentage, n.cores, n.priority) if k in limits}

"""The scheduler extender (`gpuslice scheduler-extender`): kube-scheduler's
filter and prioritize, over HTTP and JSON, for pods that ask gpuslice's
device-plugin resources, from the per-GPU state each node's plugin publishes
(node_gpus.py).

The contract is k8s.io/kube-scheduler/extender/v1 types.go and the calls of
pkg/scheduler/extender.go (HTTPExtender): a POST of ExtenderArgs
{Pod, Nodes (a NodeList, with nodeCacheCapable false), NodeNames} to
`<urlPrefix>/<verb>`; filter answers ExtenderFilterResult {Nodes, NodeNames,
FailedNodes, FailedAndUnresolvableNodes, Error}, prioritize a HostPriorityList
[{Host, Score}] with scores from 0 to MaxExtenderPriority (10). The Go types
carry no json tags, so the keys are the field names; a status other than 200
fails the call, and a filter's `Error` fails the pod's scheduling cycle.

kube-scheduler schedules one pod at a time but binds asynchronously, so the
next pod's filter can come before the last pod reaches its node, let alone its
plugin's published state. The filter therefore chooses the node itself (the
best score among those where the pod fits GPU by GPU) and returns it alone,
as HAMi's extender does, and remembers what the pod takes there until the
node's state counts it (its `pods`) or `assumed_s` passes (a pod the kubelet
refused, or one deleted before it ran)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuslice import errors, request
from gpuslice.device_plugin import gpu_fit, node_gpus
from gpuslice.device_plugin.admission import Asks, asks_of
from gpuslice.device_plugin.gpu_fit import Take
from gpuslice.device_plugin.options import NODE_POLICY, POLICIES
from gpuslice.http_json import JsonServer

log = logging.getLogger(__name__)

MAX_PRIORITY = 10  # extender/v1 MaxExtenderPriority
ASSUMED_S = 60.0  # binding and the kubelet's admission take seconds; a pod not counted by then never was
MAX_BODY = 32 << 20  # a NodeList of the GPU nodes that passed kube-scheduler's own filters
MAX_IN_FLIGHT = 8


@dataclass(frozen=True)
class Assumed:
    node: str
    takes: tuple[Take, ...]
    at: float  # monotonic s


def _pod_name(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"


def _node_name(node: dict[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("name", ""))


def _read_args(args: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """ExtenderArgs' Pod and Nodes, or one line naming what is wrong."""
    if not isinstance(args, dict) or not isinstance(args.get("Pod"), dict):
        raise errors.InvalidArgument("the request is not an ExtenderArgs (accepted: a JSON object with Pod and Nodes)")
    nodes = args.get("Nodes")
    if nodes is None and args.get("NodeNames") is not None:
        raise errors.InvalidArgument(
            "the request names nodes without their objects (NodeNames): this extender reads each node's "
            "per-GPU state from the node; set nodeCacheCapable: false"
        )
    items = (nodes or {}).get("items") if isinstance(nodes, dict) else None
    if items is None:
        items = []
    if not isinstance(items, list) or not all(isinstance(n, dict) for n in items):
        raise errors.InvalidArgument("Nodes.items is not a list of Node objects")
    return args["Pod"], items


def pod_containers(pod: dict[str, Any]) -> list[Asks]:
    """Each of the pod's containers that asks our resources: its units by
    resource and the GPUs it may be given. Init containers are counted as
    containers of their own: the kubelet gives them units of their own too,
    which the containers after may reuse."""
    found = asks_of(pod)
    return list(found.containers) if found else []


class Extender:
    def __init__(
        self, spread: bool = False, assumed_s: float = ASSUMED_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.spread = spread
        self.assumed_s = assumed_s
        self.clock = clock
        self.assumed: dict[str, Assumed] = {}  # by pod namespace/name
        self.lock = threading.Lock()

    @property
    def policy(self) -> str:
        return POLICIES[self.spread]

    def spreads(self, pod: dict[str, Any]) -> bool:
        """The pod's NODE_POLICY where it says one of POLICIES, else the extender's."""
        said = str(((pod.get("metadata") or {}).get("annotations") or {}).get(NODE_POLICY, "")).strip().lower()
        return said == request.GpuPolicy.SPREAD.value if said in POLICIES else self.spread

    def _free(self, node: dict[str, Any], pod: str) -> gpu_fit.Free:
        """The node's free units per GPU: as published, less what the pods
        placed here and not yet counted by it take. Raises with the reason."""
        name = _node_name(node)
        text = ((node.get("metadata") or {}).get("annotations") or {}).get(node_gpus.ANNOTATION)
        if text is None:
            raise errors.NotFound(
                f"node {name} publishes no per-GPU state ({node_gpus.ANNOTATION}): is gpuslice "
                "device-plugin running there, with its API access?"
            )
        state = node_gpus.decode(text)
        now = self.clock()
        takes: list[Take] = []
        for who, a in list(self.assumed.items()):
            if a.node != name or who == pod:
                continue
            if who in state.pods or now - a.at > self.assumed_s:
                del self.assumed[who]  # the node counts it now, or it never came
            else:
                takes.extend(a.takes)
        return gpu_fit.taken(state.gpus, takes)

    def filter(self, args: Any) -> dict[str, Any]:
        """ExtenderFilterResult: the one node chosen for the pod, or none, with why each other is not."""
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        try:
            pod, nodes = _read_args(args)
        except errors.GpusliceError as e:
            return _filter_result([], failed, unresolvable, str(e))
        containers = pod_containers(pod)
        asks = [dict(c.limits) for c in containers]
        if not asks:
            return _filter_result(nodes, failed, unresolvable)  # nothing of ours: not ours to judge
        who, spread = _pod_name(pod), self.spreads(pod)
        best: tuple[int, str, dict[str, Any], list[Take]] | None = None
        with self.lock:
            self.assumed.pop(who, None)  # scheduled again: its last choice did not hold
            for node in nodes:
                name = _node_name(node)
                try:
                    free = self._free(node, who)
                except errors.GpusliceError as e:
                    unresolvable[name] = str(e)
                    continue
                takes = gpu_fit.place(asks, free, containers)
                if isinstance(takes, str):
                    failed[name] = f"gpuslice: {takes}"
                    continue
                score = gpu_fit.score(asks, free, spread, containers)
                if best is None or score > best[0] or (score == best[0] and name < best[1]):
                    best = (score, name, node, takes)
            if best is None:
                return _filter_result([], failed, unresolvable)
            score, chosen, chosen_node, takes = best
            self.assumed[who] = Assumed(chosen, tuple(takes), self.clock())
        for other in nodes:
            name = _node_name(other)
            if name != chosen and name not in failed and name not in unresolvable:
                failed[name] = f"gpuslice placed the pod on {chosen}, which scores higher by {POLICIES[spread]}"
        log.info("%s: %s (%s %d); %s", who, chosen, POLICIES[spread], score,
                 ", ".join(f"{t.gpu} {'whole' if t.whole else f'{t.memory} memory {t.cores} cores'}"
                           for t in takes))  # fmt: skip
        return _filter_result([chosen_node], failed, unresolvable)

    def prioritize(self, args: Any) -> list[dict[str, Any]]:
        """HostPriorityList: each node's score by the policy (0 where the pod does not fit)."""
        pod, nodes = _read_args(args)
        containers, who, spread = pod_containers(pod), _pod_name(pod), self.spreads(pod)
        asks = [dict(c.limits) for c in containers]
        scores = []
        with self.lock:
            for node in nodes:
                try:
                    score = gpu_fit.score(asks, self._free(node, who), spread, containers) if asks else 0
                except errors.GpusliceError:
                    score = 0
                scores.append({"Host": _node_name(node), "Score": score})
        return scores


def _filter_result(
    nodes: list[dict[str, Any]], failed: dict[str, str], unresolvable: dict[str, str], error: str = ""
) -> dict[str, Any]:
    return {
        "Nodes": {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": nodes},
        "NodeNames": None,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": error,
    }


class Server(JsonServer):
    """The extender on HTTP: POST /filter and /prioritize, GET /healthz.
    Bodies are bounded, reads time out, and at most MAX_IN_FLIGHT calls run
    at once (more are answered 503 at once)."""

    accepted = "POST /filter, POST /prioritize"

    def __init__(self, extender: Extender, host: str, port: int) -> None:
        super().__init__(host, port, MAX_BODY, MAX_IN_FLIGHT)
        self.extender = extender

    def describe(self) -> str:
        return f"filter and prioritize ({self.extender.policy})"

    def post(self, path: str, body: bytes) -> tuple[int, Any] | None:
        verb = path.strip("/")
        if verb not in ("filter", "prioritize"):
            return 404, {"error": f"no verb {verb!r} (accepted: filter, prioritize)"}
        try:
            args = json.loads(body)
        except ValueError as e:
            args = None
            log.warning("%s: the body is not JSON (%s)", verb, e)
        if verb == "filter":
            return 200, self.extender.filter(args)
        try:
            return 200, self.extender.prioritize(args)
        except errors.GpusliceError as e:  # HostPriorityList has no error field: the status says it
            log.warning("prioritize: %s", e)
            return 400, {"error": str(e)}

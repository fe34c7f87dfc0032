"""`gpuslice admission-webhook` served over real TLS by the command, called
by an HTTPS client that trusts only the webhook's CA, as the API server
calls a MutatingWebhookConfiguration's service: AdmissionReview v1 in, the
review with a JSONPatch out; every rewritten pod valid for Kubernetes 1.30
and 1.36 (kubernetes-validate, strict)."""

from __future__ import annotations

import base64
import contextlib
import copy
import http.client
import json
import re
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import jsonpatch
import kubernetes_validate
import pytest

from gpuslice.admission.review import Settings, answer
from gpuslice.cli import sim_daemon
from tests.harness.helm import template
from tests.harness.references import go_json_fields, reference

HAMI_README = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "gpu-pod", "namespace": "ml"},
    "spec": {
        "containers": [
            {
                "name": "ubuntu-container",
                "image": "ubuntu:22.04",
                "command": ["bash", "-c", "sleep 86400"],
                "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}},
            }
        ]
    },
}
VOLCANO = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "vgpu", "namespace": "ml"},
    "spec": {
        "schedulerName": "volcano",
        "containers": [
            {
                "name": "cuda",
                "image": "nvidia/cuda:12.4.0-base-ubuntu22.04",
                "resources": {"limits": {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory": 2000}},
            }
        ],
    },
}


SERVICE = "gpuslice-admission.gpuslice-system.svc"  # the name the API server calls, as the chart's Service


@pytest.fixture(scope="module")
def tls(tmp_path_factory):  # type: ignore[no-untyped-def]
    """The certificate, key and CA the chart makes (helm's genCA and genSignedCert)."""
    d = tmp_path_factory.mktemp("tls")
    objects = template("1.35.0", "mode=devicePlugin", "admissionWebhook.enabled=true")
    [secret] = [o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == "gpuslice-admission-tls"]
    [config] = [o for o in objects if o["kind"] == "MutatingWebhookConfiguration"]
    for name in ("tls.crt", "tls.key"):
        (d / name).write_bytes(base64.b64decode(secret["data"][name]))
    (d / "ca.crt").write_bytes(base64.b64decode(config["webhooks"][0]["clientConfig"]["caBundle"]))
    return d


@contextlib.contextmanager
def started(tls: Path, mode: str, *extra: str, log: list[str] | None = None) -> Iterator[tuple[Url, ssl.SSLContext]]:
    """`gpuslice admission-webhook` with the chart's certificate, once it answers its health check over TLS;
    its log's lines into `log` once it has stopped."""
    port = sim_daemon.free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpuslice.cli", "admission-webhook", "--listen", f"127.0.0.1:{port}",
                             "--mode", mode, "--tls-cert", str(tls / "tls.crt"), "--tls-key", str(tls / "tls.key"),
                             *extra], stderr=subprocess.PIPE, text=True)  # fmt: skip
    ctx = ssl.create_default_context(cafile=str(tls / "ca.crt"))  # the caBundle alone, as the API server trusts
    url = Url(port)
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                call(url, ctx, "GET", "/healthz")
                break
            except ConnectionError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
                time.sleep(0.05)
        yield url, ctx
    finally:
        proc.terminate()
        proc.wait(10)
        if log is not None and proc.stderr:
            log.extend(proc.stderr.read().splitlines())


@pytest.fixture(scope="module", params=["devicePlugin", "runtimeClass"])
def webhook(request, tls):  # type: ignore[no-untyped-def]
    with started(tls, request.param, "--no-api") as (url, ctx):
        yield request.param, url, ctx


@dataclass(frozen=True)
class Url:
    port: int


def call(url: Url, ctx: ssl.SSLContext, method: str, path: str, body: bytes | None = None) -> bytes:
    """One HTTPS request to the webhook on the loopback, its certificate checked for the
    Service's name (the API server's check) against the chart's CA."""
    raw = socket.create_connection(("127.0.0.1", url.port), timeout=10)
    conn = http.client.HTTPSConnection(SERVICE, url.port, context=ctx, timeout=10)
    conn.sock = ctx.wrap_socket(raw, server_hostname=SERVICE)
    try:
        conn.request(method, path, body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        if r.status != 200:
            raise AssertionError(f"{method} {path}: {r.status} {data[:300]!r}")
        return data
    finally:
        conn.close()


def review(url: Url, ctx: ssl.SSLContext, pod: dict, operation: str = "CREATE", dry_run: bool = False) -> dict:
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml",
            "operation": operation,
            "userInfo": {"username": "system:serviceaccount:ml:trainer", "groups": ["system:authenticated"]},
            "object": pod,
            "dryRun": dry_run,
        },
    }
    return json.loads(call(url, ctx, "POST", "/mutate", json.dumps(body).encode()))


@pytest.mark.parametrize("pod", [HAMI_README, VOLCANO], ids=["hami-readme", "volcano"])
def test_a_hami_or_volcano_pod_comes_back_rewritten_and_valid(webhook, pod):
    mode, url, ctx = webhook
    got = review(url, ctx, pod)
    assert got["apiVersion"] == "admission.k8s.io/v1" and got["kind"] == "AdmissionReview"
    r = got["response"]
    assert r["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002" and r["allowed"] is True and r["patchType"] == "JSONPatch"
    out = jsonpatch.apply_patch(copy.deepcopy(pod), json.loads(base64.b64decode(r["patch"])))
    for version in ("1.30", "1.36"):
        kubernetes_validate.validate(out, version, strict=True)
    limits = out["spec"]["containers"][0]["resources"]["limits"]
    assert not any(k.startswith(("nvidia.com/", "volcano.sh/")) for k in limits)
    if mode == "devicePlugin":
        assert limits["gpuslice.io/memory"] == ("3" if pod is HAMI_README else "2")
    else:
        assert out["spec"]["runtimeClassName"] == "gpuslice"
    assert "admission.gpuslice.io/rewritten-from" in out["metadata"]["annotations"]


def example(name: str, limits: dict, annotations: dict | None = None) -> dict:
    """A pod as HAMi's examples/nvidia/<name>.yaml writes it (ubuntu, sleep, its limits and annotations)."""
    meta: dict = {"name": "gpu-pod", "namespace": "ml", **({"annotations": annotations} if annotations else {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [{
        "name": "ubuntu-container", "image": "ubuntu:18.04", "command": ["bash", "-c", "sleep 86400"],
        "resources": {"limits": limits}}]}}  # fmt: skip


# HAMi's examples/nvidia, each: what the container's limits (devicePlugin; with its env, where it gets
# any) or env (runtimeClass) become, or the start of the refusal's line
EXAMPLES = {
    "default_use": (example("default_use", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}),
                    ({"gpuslice.io/memory": "3", "gpuslice.io/cores": "30"}, {"GPUSLICE_COMPUTE_POLICY": "elastic"}),
                    {"GPUSLICE_GPUS": "1", "GPUSLICE_MEMORY": "3000Mi", "GPUSLICE_CORES": "30",
                     "GPUSLICE_COMPUTE_POLICY": "elastic"}),
    "use_memory_fraction": (example("use_memory_fraction", {"nvidia.com/gpu": 2, "nvidia.com/gpumem-percentage": 50,
                                                            "nvidia.com/gpucores": 30}),
                            "gpuslice: container ubuntu-container: 2 shared vGPUs",
                            {"GPUSLICE_GPUS": "2", "GPUSLICE_MEMORY": "50%", "GPUSLICE_CORES": "30",
                             "GPUSLICE_COMPUTE_POLICY": "elastic"}),
    "use_exclusive_card": (example("use_exclusive_card", {"nvidia.com/gpu": 2, "nvidia.com/gpumem-percentage": 100,
                                                          "nvidia.com/gpucores": 100}),
                           {"gpuslice.io/gpu": "2"}, {"GPUSLICE_GPUS": "2"}),
    "specify_index_to_use": (example("specify_index_to_use", {"nvidia.com/gpu": 1},
                                     {"nvidia.com/use-gpuindexes": "0,1"}),
                             ({"gpuslice.io/gpu": "1"}, {"GPUSLICE_DEVICE": "0,1"}),
                             {"GPUSLICE_GPUS": "1", "GPUSLICE_DEVICE": "0,1"}),
    "specify_card_type_to_use": (example("specify_card_type_to_use", {"nvidia.com/gpu": 2},
                                         {"nvidia.com/use-gputype": "A100"}),
                                 ({"gpuslice.io/gpu": "2"}, {"GPUSLICE_DEVICE_TYPE": "A100"}),
                                 {"GPUSLICE_GPUS": "2", "GPUSLICE_DEVICE_TYPE": "A100"}),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_hamis_own_examples_field_by_field(webhook, name):
    mode, url, ctx = webhook
    pod, device_plugin, runtime_class = EXAMPLES[name]
    want = device_plugin if mode == "devicePlugin" else runtime_class
    r = review(url, ctx, pod)["response"]
    if isinstance(want, str):
        assert r["allowed"] is False and r["status"]["message"].startswith(want), r
        return
    out = jsonpatch.apply_patch(copy.deepcopy(pod), json.loads(base64.b64decode(r["patch"])))
    kubernetes_validate.validate(out, "1.30", strict=True)
    [c] = out["spec"]["containers"]
    if mode == "devicePlugin":
        limits, env = want if isinstance(want, tuple) else (want, {})
        assert c["resources"]["limits"] == limits and {e["name"]: e["value"] for e in c.get("env", [])} == env
    else:
        assert c["resources"]["limits"] == {} and {e["name"]: e["value"] for e in c["env"]} == want
        assert out["spec"]["runtimeClassName"] == "gpuslice"


def test_what_cannot_be_served_is_refused_with_one_line_and_other_objects_pass(webhook):
    mode, url, ctx = webhook
    two = copy.deepcopy(HAMI_README)
    two["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 2
    r = review(url, ctx, two)["response"]
    if mode == "devicePlugin":
        assert r["allowed"] is False and r["status"]["code"] == 400
        assert r["status"]["message"].startswith("gpuslice: container ubuntu-container: 2 shared vGPUs")
    else:
        assert r["allowed"] is True  # the hook serves several GPUs of one container
    assert review(url, ctx, HAMI_README, operation="UPDATE")["response"] == {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}  # fmt: skip


def test_a_kept_connection_answers_each_request_after_a_post_to_a_path_not_served(webhook):
    """The API server's client keeps its connections: a POST the webhook does not serve is
    answered 404 in one line and its body read, so the next request on the connection is
    answered as itself (a body left unread was taken for that request: 400, bad request)."""
    _, url, ctx = webhook
    raw = socket.create_connection(("127.0.0.1", url.port), timeout=10)
    conn = http.client.HTTPSConnection(SERVICE, url.port, context=ctx, timeout=10)
    conn.sock = ctx.wrap_socket(raw, server_hostname=SERVICE)
    try:
        conn.request("POST", "/validate", b'{"kind": "AdmissionReview"}', {"Content-Type": "application/json"})
        r = conn.getresponse()
        assert (r.status, json.loads(r.read())) == (404, {"error": "no /validate (accepted: POST /mutate)"})
        conn.request("GET", "/healthz")
        r = conn.getresponse()
        assert (r.status, json.loads(r.read())) == (200, {"ok": True})
    finally:
        conn.close()


def test_the_review_and_its_answers_are_the_official_admission_v1_types():
    """Every field of what the API server sends and the webhook answers is one of
    admission/v1's types.go (k8s.io/api 0.36, Debian's golang-k8s-api-dev), those
    always sent are there, and the enums and the Status are meta/v1's."""
    types_go = (reference("admission") / "types.go").read_text()
    meta_go = (reference("meta") / "types.go").read_text()
    fields = {s: go_json_fields(types_go, s) for s in ("AdmissionReview", "AdmissionRequest", "AdmissionResponse")}
    status = go_json_fields(meta_go, "Status")
    reasons = set(re.findall(r'StatusReason\w* StatusReason = "(\w+)"', meta_go))
    patch_types = set(re.findall(r'PatchType\w* PatchType = "(\w+)"', types_go))
    operations = set(re.findall(r'\w+ +Operation = "(\w+)"', types_go))
    sent = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE",
        "userInfo": {"username": "u"}, "namespace": "ml", "object": HAMI_README}}  # fmt: skip
    assert set(sent) <= set(fields["AdmissionReview"]) and sent["request"]["operation"] in operations
    assert {k for k, always in fields["AdmissionRequest"].items() if always} <= set(sent["request"]) <= set(
        fields["AdmissionRequest"])  # fmt: skip
    two = copy.deepcopy(HAMI_README)
    two["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 2
    plain = {"apiVersion": "v1", "kind": "Pod", "spec": {"containers": []}}
    answers = [answer(dict(sent, request={**sent["request"], "object": p}), Settings("devicePlugin"))
               for p in (HAMI_README, two, plain)]  # fmt: skip
    assert {"patchType", "status"} <= {k for a in answers for k in a["response"]}  # each kind of answer is here
    for got in answers:
        assert set(got) <= set(fields["AdmissionReview"]) and got["kind"] == "AdmissionReview"
        r = got["response"]
        assert {k for k, always in fields["AdmissionResponse"].items() if always} <= set(r) <= set(
            fields["AdmissionResponse"])  # fmt: skip
        assert r["uid"] == "1" and isinstance(r["allowed"], bool)
        if "patchType" in r:
            assert r["patchType"] in patch_types and json.loads(base64.b64decode(r["patch"], validate=True))
        if "status" in r:
            assert set(r["status"]) <= set(status) and r["status"]["reason"] in reasons
            assert isinstance(r["status"]["code"], int) and r["status"]["status"] == "Failure"


def test_in_device_plugin_mode_a_vgpu_larger_than_any_published_gpu_is_refused(tls, tmp_path):
    """The webhook reads the Nodes (an API server stand-in, by kubeconfig) for the GPU
    sizes the device plugins publish (gpuslice.io/gpus) and refuses a vGPU larger than
    the largest; a node that published nothing, or something unreadable, counts for none."""
    from gpuslice.device_plugin.node_gpus import GpuFree, NodeGpus
    from tools.api_server import ApiServer

    api = ApiServer()
    try:
        a100 = NodeGpus({"GPU-a": GpuFree(80, 100, True, 80), "GPU-b": GpuFree(40, 100, True, 40)}, frozenset())
        for name, note in (("a", {"gpuslice.io/gpus": a100.encode()}), ("b", {}), ("c", {"gpuslice.io/gpus": "{"})):
            api.put_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "annotations": note}})
        config = api.kubeconfig(tmp_path / "kubeconfig")
        with started(tls, "devicePlugin", "--kubeconfig", str(config)) as (url, ctx):
            big = copy.deepcopy(HAMI_README)
            big["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = 81921
            r = review(url, ctx, big)["response"]
            assert r["allowed"] is False and r["status"]["message"] == (
                "gpuslice: container ubuntu-container: nvidia.com/gpumem 81921 MiB is more than this cluster's "
                "largest GPU has; accepted: up to 81920")  # fmt: skip
            big["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = 81920
            assert review(url, ctx, big)["response"]["allowed"] is True
    finally:
        api.stop()


def _asking(mib: int) -> dict:
    pod = copy.deepcopy(HAMI_README)
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = mib
    return pod


def _rewritten(answer: dict, pod: dict) -> dict:
    assert answer["allowed"] is True, answer
    return jsonpatch.apply_patch(copy.deepcopy(pod), json.loads(base64.b64decode(answer["patch"])))


def test_in_dra_mode_each_shapes_template_is_written_once_before_its_pods_are_let_through(tls, tmp_path):
    """Mode dra: the webhook writes the ResourceClaimTemplate a rewritten pod's claim is made
    from into the pod's namespace (an API server stand-in, by kubeconfig: a create, 409
    AlreadyExists for a name there, each object validated against Kubernetes 1.37) before
    it lets the pod through; pods of one shape share it; a dry run's pod writes nothing;
    and a pod whose template cannot be written is refused in one line, not let through
    with a claim nothing can be made from. Each template names the webhook's
    MutatingWebhookConfiguration (by its UID, as the API server has it) as its owner, so
    that Kubernetes' garbage collector deletes them with it; one that cannot be read
    leaves the templates without an owner, and lets the pods through all the same."""
    from tools.api_server import ApiServer

    api = ApiServer()
    uid = "6b1c2f0e-3d4a-4b5c-8d9e-0f1a2b3c4d5e"
    api.put_webhook_configuration({"apiVersion": "admissionregistration.k8s.io/v1",
                                   "kind": "MutatingWebhookConfiguration",
                                   "metadata": {"name": "gpuslice-admission", "uid": uid}})  # fmt: skip
    owned = ("--templates-owner", "gpuslice-admission")
    try:
        config = api.kubeconfig(tmp_path / "kubeconfig")
        with started(tls, "dra", "--kubeconfig", str(config), *owned) as (url, ctx):
            out = _rewritten(review(url, ctx, HAMI_README)["response"], HAMI_README)
            kubernetes_validate.validate(out, "1.37", strict=True)
            [claim] = out["spec"]["resourceClaims"]
            name = claim["resourceClaimTemplateName"]
            assert api.template_posts == [("ml", name)] and not api.invalid
            assert api.templates[("ml", name)]["metadata"]["ownerReferences"] == [
                {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                 "name": "gpuslice-admission", "uid": uid}]  # fmt: skip
            written = api.templates[("ml", name)]["spec"]["spec"]["devices"]["requests"][0]["exactly"]
            assert written["capacity"] == {"requests": {"memory": "3000Mi", "cores": "30"}}
            assert _rewritten(review(url, ctx, HAMI_README)["response"], HAMI_README) == out
            assert len(api.template_posts) == 1  # the same shape again: the one template, no second write

            dry = review(url, ctx, _asking(5000), dry_run=True)["response"]
            assert dry["allowed"] is True and len(api.template_posts) == 1  # rewritten, nothing written

            # a restarted webhook (nothing remembered) finds its template there: 409, read back, the same
            with started(tls, "dra", "--kubeconfig", str(config), *owned) as (url2, ctx2):
                assert _rewritten(review(url2, ctx2, HAMI_README)["response"], HAMI_README) == out
                assert api.template_posts == [("ml", name)] * 2 and len(api.templates) == 1

            # someone else's object under the name the next shape's template is to have
            theirs = _rewritten(review(url, ctx, _asking(6000), dry_run=True)["response"], _asking(6000))
            taken = theirs["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
            api.put_template({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                              "metadata": {"name": taken, "namespace": "ml"},
                              "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                                  "deviceClassName": "gpuslice.io"}}]}}}})  # fmt: skip
            r = review(url, ctx, _asking(6000))["response"]
            assert r["allowed"] is False and r["status"]["message"] == (
                f"gpuslice: ResourceClaimTemplate ml/{taken} exists and asks something else (it is not one the "
                "webhook wrote); accepted: that name left to gpuslice's webhook")  # fmt: skip

            api.refuse_templates = 403  # RBAC without resourceclaimtemplates
            r = review(url, ctx, _asking(7000))["response"]
            assert r["allowed"] is False and r["status"]["code"] == 503 and "patch" not in r
            assert re.fullmatch(r"gpuslice: ResourceClaimTemplate ml/gpuslice-hami-[0-9a-f]{16}: the API server "
                                r"answered 403 Forbidden", r["status"]["message"]), r  # fmt: skip
        api.refuse_templates = None
        with started(tls, "dra", "--kubeconfig", str(config), "--templates-owner", "not-there") as (url, ctx):
            r = review(url, ctx, _asking(8000))["response"]
            assert r["allowed"] is True  # its owner not found: the template is written without one
            [written] = [t for t in api.templates.values() if "8000Mi" in json.dumps(t)]
            assert "ownerReferences" not in written["metadata"] and not api.invalid
        with started(tls, "dra", "--no-api") as (url, ctx):
            r = review(url, ctx, HAMI_README)["response"]
            assert r["allowed"] is False and r["status"]["message"] == (
                "gpuslice: mode dra writes each rewritten pod's ResourceClaimTemplate through the API server, and "
                "this webhook runs without it (--no-api)")  # fmt: skip
    finally:
        api.stop()


def test_in_dra_mode_a_template_found_without_its_owner_is_given_it(tls, tmp_path):
    """A template there before owners were named (an older webhook's), or naming a configuration
    of that name since deleted and made again (another UID), is given the owner when a pod of its
    shape comes: a merge patch conditional on its resourceVersion, its other owners kept. One
    already owned is not patched again; one that cannot be patched (RBAC without `patch`) is
    said once in the log and used all the same."""
    from tools.api_server import ApiServer

    api = ApiServer()
    uid = "0c9d8e7f-6a5b-4c3d-9e2f-1a0b9c8d7e6f"
    ours = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "name": "gpuslice-admission", "uid": uid}  # fmt: skip
    api.put_webhook_configuration({"apiVersion": ours["apiVersion"], "kind": ours["kind"],
                                   "metadata": {"name": ours["name"], "uid": uid}})  # fmt: skip
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "keep-me", "uid": "5e4d3c2b-1a09-4f8e-a7d6-c5b4a3928170"}
    try:
        config = api.kubeconfig(tmp_path / "kubeconfig")
        with started(tls, "dra", "--kubeconfig", str(config)) as (url, ctx):  # an older webhook: no owner named
            names = []
            for mib in (3000, 4000, 5000, 6000):
                out = _rewritten(review(url, ctx, _asking(mib))["response"], _asking(mib))
                names.append(out["spec"]["resourceClaims"][0]["resourceClaimTemplateName"])
        assert all("ownerReferences" not in api.templates[("ml", n)]["metadata"] for n in names)
        stale = {**ours, "uid": "9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a"}  # the configuration made again since
        api.templates[("ml", names[1])]["metadata"]["ownerReferences"] = [other, stale]

        with started(tls, "dra", "--kubeconfig", str(config), "--templates-owner", "gpuslice-admission") as (url, ctx):
            for mib in (3000, 4000):
                assert review(url, ctx, _asking(mib))["response"]["allowed"] is True
            assert api.template_patches == [("ml", names[0]), ("ml", names[1])] and not api.invalid
            assert api.templates[("ml", names[0])]["metadata"]["ownerReferences"] == [ours]
            assert api.templates[("ml", names[1])]["metadata"]["ownerReferences"] == [other, ours]
        log: list[str] = []
        owned = ("--templates-owner", "gpuslice-admission")
        with started(tls, "dra", "--kubeconfig", str(config), *owned, log=log) as (url, ctx):
            assert review(url, ctx, _asking(3000))["response"]["allowed"] is True
            assert len(api.template_patches) == 2  # found owned (409, read back): not patched again

            api.refuse_template_patches = 403
            for mib in (5000, 6000):
                assert review(url, ctx, _asking(mib))["response"]["allowed"] is True  # used all the same
            assert all("ownerReferences" not in api.templates[("ml", n)]["metadata"] for n in names[2:])
    finally:
        api.stop()
    said = [line for line in log if "giving it its owner" in line]
    assert len(said) == 1 and said[0].endswith(
        f"ResourceClaimTemplate ml/{names[2]}: giving it its owner, the API server: 403 Forbidden; templates found "
        "without it stay so (not deleted with the webhook)"), log  # fmt: skip


def test_a_connection_that_never_starts_tls_holds_back_no_one_else(webhook):
    """The TLS handshake runs on the connection's own thread, under the read timeout: a
    caller that connects and sends nothing (or one that stalls mid-handshake) cannot keep
    the webhook from accepting, and its connection is closed once the timeout passes."""
    _, url, ctx = webhook
    silent = [socket.create_connection(("127.0.0.1", url.port), timeout=30) for _ in range(3)]
    try:
        started_at = time.monotonic()
        assert json.loads(call(url, ctx, "GET", "/healthz")) == {"ok": True}
        assert time.monotonic() - started_at < 5  # answered while the silent ones still wait
        assert silent[0].recv(1) == b""  # closed by the webhook (10 s), not by this test's 30 s
    finally:
        for s in silent:
            s.close()

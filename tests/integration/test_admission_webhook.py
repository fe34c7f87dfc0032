"""`gpuslice admission-webhook` served over real TLS by the command, called
by an HTTPS client that trusts only the webhook's CA, as the API server
calls a MutatingWebhookConfiguration's service: AdmissionReview v1 in, the
review with a JSONPatch out; every rewritten pod valid for Kubernetes 1.30
and 1.36 (kubernetes-validate, strict)."""

from __future__ import annotations

import base64
import copy
import json
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

import jsonpatch
import kubernetes_validate
import pytest

from gpuslice.cli import sim_daemon

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


@pytest.fixture(scope="module")
def tls(tmp_path_factory):  # type: ignore[no-untyped-def]
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=webhook-ca",
            "-keyout",
            str(d / "ca.key"),
            "-out",
            str(d / "ca.crt"),
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            "openssl",
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=gpuslice-webhook.gpuslice.svc",
            "-keyout",
            str(d / "tls.key"),
            "-out",
            str(d / "tls.csr"),
        ],
        check=True,
        capture_output=True,
    )
    (d / "ext").write_text("subjectAltName=DNS:gpuslice-webhook.gpuslice.svc,IP:127.0.0.1\n")
    subprocess.run(
        [
            "openssl",
            "x509",
            "-req",
            "-in",
            str(d / "tls.csr"),
            "-CA",
            str(d / "ca.crt"),
            "-CAkey",
            str(d / "ca.key"),
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            str(d / "ext"),
            "-out",
            str(d / "tls.crt"),
        ],
        check=True,
        capture_output=True,
    )
    return d


@pytest.fixture(scope="module", params=["devicePlugin", "runtimeClass"])
def webhook(request, tls):  # type: ignore[no-untyped-def]
    port = sim_daemon.free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpuslice.cli", "admission-webhook", "--listen", f"127.0.0.1:{port}",
                             "--mode", request.param, "--tls-cert", str(tls / "tls.crt"), "--tls-key",
                             str(tls / "tls.key")], stderr=subprocess.PIPE, text=True)  # fmt: skip
    ctx = ssl.create_default_context(cafile=str(tls / "ca.crt"))
    url = f"https://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:  # until it answers its health check over TLS
        try:
            urllib.request.urlopen(f"{url}/healthz", context=ctx, timeout=2).read()
            break
        except (urllib.error.URLError, ConnectionError):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
    yield request.param, url, ctx
    proc.terminate()
    proc.wait(10)


def review(url: str, ctx: ssl.SSLContext, pod: dict, operation: str = "CREATE") -> dict:
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml",
            "operation": operation,
            "object": pod,
        },
    }
    req = urllib.request.Request(f"{url}/mutate", json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, context=ctx, timeout=10).read())


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
    assert "gpuslice.io/rewritten-from" in out["metadata"]["annotations"]


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

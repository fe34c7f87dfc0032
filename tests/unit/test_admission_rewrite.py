"""Pods written for HAMi or Volcano's vGPU, rewritten into gpuslice's words
(admission/): the pods are rebuilt from the projects' own examples (HAMi's
README: `nvidia.com/gpu: 1` with `nvidia.com/gpumem: 3000`, "each vGPU
contains 3000m device memory"; its webhook adds one vGPU where only memory
or cores are asked; HAMi-core's GPU_CORE_UTILIZATION_POLICY default/force/
disable; Volcano's vgpu-number/-memory/-cores), and each JSONPatch applied
to the pod is checked field by field."""

from __future__ import annotations

import copy
import json

import jsonpatch
import pytest

from gpuslice import errors, request
from gpuslice.admission import hami
from gpuslice.admission.rewrite import RECORD, rewrite


def pod(*containers: dict, annotations: dict | None = None) -> dict:
    meta: dict = {"name": "p", "namespace": "ml"}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": list(containers)}}


def ctr(name: str, limits: dict, env: list | None = None) -> dict:
    c: dict = {"name": name, "image": "cuda:12", "resources": {"limits": limits}}
    if env is not None:
        c["env"] = env
    return c


def applied(p: dict, mode: str) -> tuple[dict, dict]:
    r = rewrite(p, mode)
    out = jsonpatch.apply_patch(copy.deepcopy(p), r.patch)
    return out, r.record


HAMI_README = pod(ctr("cuda", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}))


def test_hamis_example_becomes_the_device_plugins_resources_rounded_up_never_less():
    out, record = applied(HAMI_README, "devicePlugin")
    [c] = out["spec"]["containers"]
    assert c["resources"]["limits"] == {"gpuslice.io/memory": "3", "gpuslice.io/cores": "30"}  # 3000 MiB -> 3 GiB
    assert {"name": "GPUSLICE_COMPUTE_POLICY", "value": "elastic"} in c["env"]  # HAMi-core's default may exceed
    said = json.loads(out["metadata"]["annotations"][RECORD])
    assert said == record and said["cuda"]["from"] == {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000",
                                                        "nvidia.com/gpucores": "30"}  # fmt: skip
    assert "runtimeClassName" not in out["spec"]


def test_in_runtime_class_mode_each_container_asks_in_its_own_environment():
    p = pod(ctr("a", {"nvidia.com/gpumem": "3000"}, env=[{"name": "X", "value": "1"}]),
            ctr("b", {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50", "nvidia.com/gpucores": "40"},
                env=[{"name": hami_policy(), "value": "force"}]),
            ctr("sidecar", {"cpu": "1"}))  # fmt: skip
    out, _ = applied(p, "runtimeClass")
    a, b, side = out["spec"]["containers"]
    assert out["spec"]["runtimeClassName"] == "gpuslice"
    env_a = {e["name"]: e["value"] for e in a["env"]}
    assert env_a == {"X": "1", "GPUSLICE_GPUS": "1", "GPUSLICE_MEMORY": "3000Mi"}  # one vGPU added, as HAMi does
    env_b = {e["name"]: e["value"] for e in b["env"]}
    assert env_b["GPUSLICE_MEMORY"] == "50%" and env_b["GPUSLICE_CORES"] == "40"
    assert env_b["GPUSLICE_COMPUTE_POLICY"] == "hard"  # force: a hard share
    assert a["resources"]["limits"] == {} and b["resources"]["limits"] == {} and side == p["spec"]["containers"][2]


def hami_policy() -> str:
    from gpuslice.admission.rewrite import HAMI_POLICY_ENV

    return HAMI_POLICY_ENV


def test_a_count_alone_is_whole_gpus_and_volcanos_words_are_read_too():
    out, _ = applied(pod(ctr("w", {"nvidia.com/gpu": "2"})), "devicePlugin")
    assert out["spec"]["containers"][0]["resources"]["limits"] == {"gpuslice.io/gpu": "2"}
    volcano = pod(ctr("v", {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "1025"}))
    out, record = applied(volcano, "devicePlugin")
    assert out["spec"]["containers"][0]["resources"]["limits"] == {"gpuslice.io/memory": "2"}  # 1025 MiB: 2 GiB
    assert record["v"]["from"] == {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "1025"}


def test_priority_disable_and_pinned_devices():
    p = pod(ctr("c", {"nvidia.com/gpumem": "2048", "nvidia.com/gpucores": "20", "nvidia.com/priority": "0"},
                env=[{"name": hami_policy(), "value": "disable"}]),
            annotations={hami.USE_UUID: "GPU-aaaaaaaa-0000-0000-0000-000000000000"})  # fmt: skip
    out, _ = applied(p, "runtimeClass")
    [c] = out["spec"]["containers"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert "GPUSLICE_CORES" not in env  # disable: no share of compute
    assert env["GPUSLICE_PRIORITY"] == "high"  # HAMi: 0 high, 1 low
    assert env["GPUSLICE_DEVICE"] == "GPU-aaaaaaaa-0000-0000-0000-000000000000"  # the container's, not its sidecars'
    assert "gpuslice.io/device" not in out["metadata"]["annotations"]
    # in devicePlugin mode the same pin, which the extender and the plugin heed (the kubelet asks the plugin)
    out, record = applied(p, "devicePlugin")
    [c] = out["spec"]["containers"]
    assert {e["name"]: e["value"] for e in c["env"] if e["name"].startswith("GPUSLICE_")} == {
        "GPUSLICE_PRIORITY": "high",
        "GPUSLICE_DEVICE": "GPU-aaaaaaaa-0000-0000-0000-000000000000",
    }
    assert record["c"]["to"]["GPUSLICE_DEVICE"] == "GPU-aaaaaaaa-0000-0000-0000-000000000000"


def test_hamis_index_pins_and_its_exclusive_card_example():
    """HAMi's examples/nvidia: specify_index_to_use.yaml (use-gpuindexes "0,1": either card) and
    use_exclusive_card.yaml (2 GPUs at gpumem-percentage 100 and gpucores 100: whole cards)."""
    pinned = pod(ctr("c", {"nvidia.com/gpu": 1}), annotations={hami.USE_INDEX: "0,1"})
    out, _ = applied(pinned, "runtimeClass")
    env = {e["name"]: e["value"] for e in out["spec"]["containers"][0]["env"]}
    assert env == {"GPUSLICE_GPUS": "1", "GPUSLICE_DEVICE": "0,1"}  # one GPU, chosen among the two
    exclusive = pod(ctr("c", {"nvidia.com/gpu": 2, "nvidia.com/gpumem-percentage": 100, "nvidia.com/gpucores": 100}))
    out, record = applied(exclusive, "devicePlugin")
    assert out["spec"]["containers"][0]["resources"]["limits"] == {"gpuslice.io/gpu": "2"}
    assert record["c"]["to"] == {"gpuslice.io/gpu": "2"}
    out, _ = applied(exclusive, "runtimeClass")
    assert out["spec"]["containers"][0]["env"] == [{"name": "GPUSLICE_GPUS", "value": "2"}]


def test_a_pod_that_asks_no_gpu_is_left_as_it_is():
    assert rewrite(pod(ctr("c", {"cpu": "1"})), "devicePlugin").patch == []


@pytest.mark.parametrize(("limits", "mode", "said"), [
    ({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "1000"}, "devicePlugin", "container c: 2 shared vGPUs"),
    ({"nvidia.com/gpumem-percentage": "50"}, "devicePlugin", "container c: nvidia.com/gpumem-percentage in "
                                                             "devicePlugin mode"),
    ({"nvidia.com/gpucores": "30"}, "devicePlugin", "container c: cores without memory"),
    ({"nvidia.com/gpumem": "lots"}, "devicePlugin", "nvidia.com/gpumem: 'lots' is not MiB of GPU memory"),
    ({"nvidia.com/gpumem": "1", "nvidia.com/gpumem-percentage": "5"}, "runtimeClass", "together"),
    ({"nvidia.com/gpucores": "101", "nvidia.com/gpumem": "1"}, "runtimeClass", "accepted: an integer from 0 to 100"),
    ({"nvidia.com/gpumem": "1"}, "mig", "mode 'mig'; accepted: devicePlugin, runtimeClass, dra"),
    ({"nvidia.com/gpumem-percentage": "50"}, "dra", "container c: nvidia.com/gpumem-percentage in dra mode"),
    ({"nvidia.com/gpucores": "30"}, "dra", "container c: cores without memory"),
])  # fmt: skip
def test_what_cannot_be_asked_of_gpuslice_is_refused_in_one_line(limits, mode, said):
    with pytest.raises(errors.InvalidArgument) as e:
        rewrite(pod(ctr("c", limits)), mode)
    assert said in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("mode", ["devicePlugin", "runtimeClass"])
def test_hamis_constraints_on_a_pods_gpus_become_each_gpu_containers_choice(mode):
    """Outside dra mode HAMi's use-/nouse- annotations are the GPU containers' own choice (a pod
    annotation would reach its sidecars), in the words the plugin, the extender and the hook read."""
    notes = {hami.USE_TYPE: "A100, H100", hami.NOUSE_TYPE: "PCIe",
             hami.NOUSE_UUID: "GPU-bbbbbbbb-0000-0000-0000-000000000000", hami.NOUSE_INDEX: "3"}  # fmt: skip
    p = pod(ctr("main", {"nvidia.com/gpumem": "1000"}), ctr("sidecar", {"cpu": "1"}), annotations=notes)
    out, record = applied(p, mode)
    main, sidecar = out["spec"]["containers"]
    env = {e["name"]: e["value"] for e in main["env"]}
    assert {k: v for k, v in env.items() if "DEVICE" in k} == {
        "GPUSLICE_DEVICE_TYPE": "A100,H100",
        "GPUSLICE_AVOID_DEVICE_TYPE": "PCIe",
        "GPUSLICE_AVOID_DEVICE": "GPU-bbbbbbbb-0000-0000-0000-000000000000,3",
    }
    assert "env" not in sidecar and record["main"]["to"]["GPUSLICE_DEVICE_TYPE"] == "A100,H100"
    choice = request.read_compute(request.gather({}, [f"{k}={v}" for k, v in env.items() if "DEVICE" in k])).choice
    assert choice.admits(0, "GPU-aaaaaaaa-0000-0000-0000-000000000000", "NVIDIA H100 80GB HBM3")
    assert not choice.admits(0, "GPU-aaaaaaaa-0000-0000-0000-000000000000", "NVIDIA A100 80GB PCIe")
    assert not choice.admits(3, "GPU-aaaaaaaa-0000-0000-0000-000000000000", "NVIDIA H100 80GB HBM3")


@pytest.mark.parametrize(("key", "value", "says"), [
    (hami.USE_TYPE, "A100;H100", 'environment variable GPUSLICE_DEVICE_TYPE: "A100;H100" is not valid'),
    (hami.NOUSE_UUID, "MIG-1", 'environment variable GPUSLICE_AVOID_DEVICE: "MIG-1" is not valid'),
])  # fmt: skip
@pytest.mark.parametrize("mode", ["devicePlugin", "runtimeClass"])
def test_a_constraint_the_node_would_refuse_is_refused_at_creation_in_one_line(key, value, says, mode):
    with pytest.raises(errors.InvalidArgument) as e:
        rewrite(pod(ctr("c", {"nvidia.com/gpumem": "1000"}), annotations={key: value}), mode)
    assert str(e.value).startswith("container c, asked of gpuslice: ") and says in str(e.value)
    assert "\n" not in str(e.value)


def test_hamis_scheduler_is_mapped_and_its_gpu_policy_is_each_gpu_containers_outside_dra_mode():
    """HAMi's per-pod gpu-scheduler-policy (binpack or spread) becomes each GPU container's
    GPUSLICE_GPU_POLICY in devicePlugin and runtimeClass mode (the extender, the plugin and the
    daemon's placement order the GPUs by it); in dra mode, or for a policy gpuslice has not,
    it stays on the pod and the record says it was not translated."""
    p = pod(ctr("c", {"nvidia.com/gpumem": "1000"}), ctr("sidecar", {}), annotations={hami.POLICY: "Spread"})
    p["spec"]["schedulerName"] = "hami-scheduler"
    r = rewrite(p, "devicePlugin", schedulers={"hami-scheduler": "gpuslice-scheduler"})
    out = jsonpatch.apply_patch(copy.deepcopy(p), r.patch)
    assert out["spec"]["schedulerName"] == "gpuslice-scheduler"
    said = json.loads(out["metadata"]["annotations"][RECORD])
    assert said["schedulerName"] == {"from": "hami-scheduler", "to": "gpuslice-scheduler"}
    assert said[hami.POLICY] == {"from": "Spread", "to": "GPUSLICE_GPU_POLICY"}
    assert {"name": "GPUSLICE_GPU_POLICY", "value": "spread"} in out["spec"]["containers"][0]["env"]
    assert not out["spec"]["containers"][1].get("env")  # a sidecar asks no GPU: no policy of it
    env = jsonpatch.apply_patch(copy.deepcopy(p), rewrite(p, "runtimeClass").patch)["spec"]["containers"][0]["env"]
    assert {"name": "GPUSLICE_GPU_POLICY", "value": "spread"} in env
    # HAMi's node-scheduler-policy: the pod's own choice among nodes for the extender (devicePlugin mode's)
    from gpuslice.device_plugin.options import NODE_POLICY

    q = pod(ctr("c", {"nvidia.com/gpumem": "1000"}), annotations={hami.NODE_POLICY: "Spread"})
    for mode, to in (("devicePlugin", NODE_POLICY), ("runtimeClass", None), ("dra", None)):
        done = jsonpatch.apply_patch(copy.deepcopy(q), rewrite(q, mode).patch)
        notes = done["metadata"]["annotations"]
        assert json.loads(notes[RECORD])[hami.NODE_POLICY] == {"from": "Spread", "to": to}
        assert notes.get(NODE_POLICY) == ("spread" if to else None)
    for mode, policy in (("dra", "spread"), ("devicePlugin", "topology-aware")):
        q = pod(ctr("c", {"nvidia.com/gpumem": "1000"}), annotations={hami.POLICY: policy})
        done = jsonpatch.apply_patch(copy.deepcopy(q), rewrite(q, mode).patch)
        assert json.loads(done["metadata"]["annotations"][RECORD])[hami.POLICY] == {"from": policy, "to": None}
        assert done["metadata"]["annotations"][hami.POLICY] == policy
        assert not any(e["name"] == "GPUSLICE_GPU_POLICY" for e in done["spec"]["containers"][0].get("env", []))
    other = dict(p, spec={**p["spec"], "schedulerName": "volcano"})
    assert not any(op["path"] == "/spec/schedulerName" for op in rewrite(other, "devicePlugin", schedulers={
        "hami-scheduler": "default-scheduler"}).patch)  # fmt: skip


def test_more_memory_than_the_largest_gpu_is_refused_where_the_largest_is_known():
    p = pod(ctr("c", {"nvidia.com/gpumem": "90000"}))
    assert rewrite(p, "runtimeClass").patch  # not known: placement refuses it
    with pytest.raises(errors.InvalidArgument) as e:
        rewrite(p, "runtimeClass", largest_gpu_mib=81920)
    assert str(e.value) == ("container c: nvidia.com/gpumem 90000 MiB is more than this cluster's largest GPU has; "
                            "accepted: up to 81920")  # fmt: skip


def test_a_second_pass_changes_nothing():
    for mode in ("devicePlugin", "runtimeClass", "dra"):
        once, _ = applied(HAMI_README, mode)
        assert rewrite(once, mode).patch == []


@pytest.mark.parametrize("pair", ["hami-scheduler", "=default-scheduler", "Hami=x", "a=b c"])
def test_a_bad_scheduler_mapping_is_one_line(pair):
    from gpuslice.admission.options import WebhookOptions

    with pytest.raises(errors.InvalidArgument) as e:
        WebhookOptions(scheduler_names=(pair,)).schedulers()
    assert str(e.value).startswith(f"--scheduler-name {pair!r}: accepted FROM=TO")


def test_the_largest_gpu_is_the_configured_one_else_the_largest_published_and_kept_when_unreadable():
    from gpuslice.admission.largest import LargestGpu, largest_published
    from gpuslice.device_plugin.node_gpus import GpuFree, NodeGpus

    def node(units: int | None) -> dict:
        note = {} if units is None else {"gpuslice.io/gpus": NodeGpus({"GPU-x": GpuFree(0, 0, False, units)},
                                                                        frozenset()).encode()}  # fmt: skip
        return {"metadata": {"name": "n", "annotations": note}}

    assert largest_published([node(80), node(None), node(141)]) == 141 * 1024
    answers: list = [[node(80)], errors.Unavailable("nodes: the API server: refused")]

    def lister() -> list[dict]:
        got = answers.pop(0)
        if isinstance(got, Exception):
            raise got
        return got

    sizes = LargestGpu(0, lister)
    sizes.refresh()
    assert sizes.mib() == 80 * 1024
    sizes.refresh()  # the API server away: the last size kept
    assert sizes.mib() == 80 * 1024
    assert LargestGpu(1000, lister).mib() == 1000


@pytest.mark.parametrize(("limits", "pins", "said"), [
    ({"nvidia.com/gpu": 2}, "GPU-aaaaaaaa-0000-0000-0000-000000000000", "asks for more GPUs than gpuslice.io/device"),
    ({"nvidia.com/gpu": 1}, "the-big-one", "environment variable GPUSLICE_DEVICE"),
])  # fmt: skip
def test_in_runtime_class_mode_what_the_hook_would_refuse_at_start_is_refused_at_creation(limits, pins, said):
    with pytest.raises(errors.InvalidArgument) as e:
        rewrite(pod(ctr("c", limits), annotations={hami.USE_UUID: pins}), "runtimeClass")
    assert str(e.value).startswith("container c, asked of gpuslice: ") and said in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


# -- mode dra ------------------------------------------------------------------------------------


def _template_of(p: dict, container: int = 0) -> dict:
    r = rewrite(p, "dra")
    out = jsonpatch.apply_patch(copy.deepcopy(p), r.patch)
    claim = out["spec"]["containers"][container]["resources"]["claims"][-1]  # ours: after any of its own
    [pod_claim] = [c for c in out["spec"]["resourceClaims"] if c["name"] == claim["name"]]
    [t] = [t for t in r.templates if t["metadata"]["name"] == pod_claim["resourceClaimTemplateName"]]
    return t


def test_in_dra_mode_hamis_example_is_a_claim_of_the_same_from_a_template_of_its_namespace():
    p = pod(ctr("cuda", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30,
                         "nvidia.com/priority": 0}, env=[{"name": hami_policy(), "value": "force"}]))  # fmt: skip
    r = rewrite(p, "dra")
    out = jsonpatch.apply_patch(copy.deepcopy(p), r.patch)
    [c] = out["spec"]["containers"]
    assert c["resources"] == {"limits": {}, "claims": [{"name": "gpuslice-0"}]}  # HAMi's gone, nothing in env
    assert c["env"] == [{"name": hami_policy(), "value": "force"}]
    [t] = r.templates
    assert out["spec"]["resourceClaims"] == [{"name": "gpuslice-0", "resourceClaimTemplateName": t["metadata"]["name"]}]
    assert t["metadata"]["name"].startswith("gpuslice-hami-") and "namespace" not in t["metadata"]
    devices = t["spec"]["spec"]["devices"]
    assert devices["requests"] == [
        {
            "name": "gpu",
            "exactly": {
                "deviceClassName": "gpuslice.io",
                "capacity": {"requests": {"memory": "3000Mi", "cores": "30"}},
            },
        }
    ]
    assert devices["config"] == [
        {
            "requests": ["gpu"],
            "opaque": {
                "driver": "gpuslice.io",
                "parameters": {
                    "apiVersion": "gpuslice.io/v1",
                    "kind": "SliceConfig",
                    "computePolicy": "hard",
                    "priority": "high",
                },
            },
        }
    ]
    said = json.loads(out["metadata"]["annotations"][RECORD])["cuda"]["to"]
    assert said == {"resourceClaimTemplate": t["metadata"]["name"], "deviceClassName": "gpuslice.io",
                    "memory": "3000Mi", "cores": "30", "computePolicy": "hard", "priority": "high"}  # fmt: skip


def test_in_dra_mode_one_shape_is_one_template_and_each_container_its_own_claim():
    same = {"nvidia.com/gpumem": "4096", "nvidia.com/gpucores": "20"}
    p = pod(ctr("a", same), ctr("sidecar", {"cpu": "1"}), ctr("b", dict(same)), ctr("c", {"nvidia.com/gpu": "2"}))
    p["spec"]["resourceClaims"] = [{"name": "theirs", "resourceClaimTemplateName": "other"}]
    p["spec"]["containers"][0]["resources"]["claims"] = [{"name": "theirs"}]
    r = rewrite(p, "dra")
    out = jsonpatch.apply_patch(copy.deepcopy(p), r.patch)
    assert [c["name"] for c in out["spec"]["resourceClaims"]] == ["theirs", "gpuslice-0", "gpuslice-2", "gpuslice-3"]
    assert out["spec"]["containers"][0]["resources"]["claims"] == [{"name": "theirs"}, {"name": "gpuslice-0"}]
    assert "claims" not in out["spec"]["containers"][1]["resources"]
    assert len(r.templates) == 2  # a and b ask alike: one template, two claims
    assert _template_of(p, 0) == _template_of(p, 2) != _template_of(p, 3)
    whole = _template_of(p, 3)["spec"]["spec"]["devices"]
    assert whole["requests"] == [{"name": "gpu", "exactly": {"deviceClassName": "whole.gpuslice.io", "count": 2}}]
    assert whole["constraints"] == [{"requests": ["gpu"], "distinctAttribute": "gpuslice.io/uuid"}]  # two GPUs
    # elastic (HAMi-core's default), and memory alone where the policy is disable: no cores booked
    assert _template_of(p)["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["computePolicy"] == "elastic"
    off = pod(ctr("c", {"nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "30"},
                  env=[{"name": hami_policy(), "value": "disable"}]))  # fmt: skip
    assert _template_of(off)["spec"]["spec"]["devices"] == {
        "requests": [
            {
                "name": "gpu",
                "exactly": {"deviceClassName": "gpuslice.io", "capacity": {"requests": {"memory": "1000Mi"}}},
            }
        ]
    }
    taken = pod(ctr("c", {"nvidia.com/gpumem": "1000"}))
    taken["spec"]["resourceClaims"] = [{"name": "gpuslice-0", "resourceClaimTemplateName": "x"}]
    with pytest.raises(errors.InvalidArgument, match="the pod has a claim named gpuslice-0 already"):
        rewrite(taken, "dra")


def test_in_dra_mode_every_placement_annotation_is_a_selector_of_the_request():
    a = {hami.USE_TYPE: "A100, h100", hami.NOUSE_TYPE: "PCIe", hami.USE_UUID: "GPU-1a2b,GPU-3c4d",
         hami.NOUSE_UUID: "GPU-dead", hami.USE_INDEX: "0,2", hami.NOUSE_INDEX: "1"}  # fmt: skip
    t = _template_of(pod(ctr("c", {"nvidia.com/gpumem": "1000"}), annotations=a))
    found = [s["cel"]["expression"] for s in t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"]]
    attr = 'device.attributes["gpuslice.io"]'
    assert found == [
        f'({attr}.uuid in ["GPU-1a2b", "GPU-3c4d"])', f'!({attr}.uuid in ["GPU-dead"])',
        f"({attr}.index in [0, 2])", f"!({attr}.index in [1])",
        f'{attr}.productName.matches("(?i)(A100|h100)")', f'!{attr}.productName.matches("(?i)(PCIe)")',
    ]  # fmt: skip
    dotted = _template_of(pod(ctr("c", {"nvidia.com/gpumem": "1"}), annotations={hami.USE_TYPE: "RTX 6000 Ada.v2"}))
    [sel] = dotted["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
    assert sel["cel"]["expression"].endswith('matches("(?i)(RTX 6000 Ada\\\\.v2)")')  # a dot is a dot


@pytest.mark.parametrize(("key", "value", "said"), [
    (hami.USE_TYPE, 'A100") || true || ("', "is not a GPU type"),
    (hami.NOUSE_UUID, 'GPU-1"]', "is not a GPU's UUID"),
    (hami.USE_INDEX, "first", "is not a GPU's index"),
])  # fmt: skip
def test_in_dra_mode_a_placement_value_that_is_no_gpus_is_one_line_and_never_reaches_an_expression(key, value, said):
    with pytest.raises(errors.InvalidArgument) as e:
        rewrite(pod(ctr("c", {"nvidia.com/gpumem": "1000"}), annotations={key: value}), "dra")
    assert str(e.value).startswith(f"annotation {key}: {value!r} {said}; accepted: ") and "\n" not in str(e.value)


@pytest.mark.parametrize("version", ["1.36", "1.37"])
def test_in_dra_mode_the_pod_and_its_templates_are_valid_kubernetes_objects(version):
    import kubernetes_validate

    a = {hami.USE_TYPE: "A100", hami.NOUSE_UUID: "GPU-dead"}
    p = pod(ctr("a", {"nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30", "nvidia.com/priority": "1"}),
            ctr("b", {"volcano.sh/vgpu-number": "2"}), annotations=a)  # fmt: skip
    r = rewrite(p, "dra")
    kubernetes_validate.validate(jsonpatch.apply_patch(copy.deepcopy(p), r.patch), version, strict=True)
    for t in r.templates:
        kubernetes_validate.validate({**t, "metadata": {**t["metadata"], "namespace": "ml"}}, version, strict=True)


def test_hamis_numa_bind_is_served_where_gpuslice_places_the_gpus_and_a_mig_instance_is_refused_in_one_line():
    """nvidia.com/numa-bind: "true" becomes GPUSLICE_NUMA_BIND in runtimeClass mode (the daemon's
    placement) and a matchAttribute constraint on the driver's numaGroup in dra mode (kube-scheduler's);
    in devicePlugin mode, where the kubelet picks a container's whole GPUs, it stays on the pod,
    recorded as not translated, as "false" and words it does not know are everywhere. vgpu-mode
    hami-core is recorded as not translated; vgpu-mode mig asks what gpuslice does not give."""
    import kubernetes_validate

    served = {"devicePlugin": None, "runtimeClass": "GPUSLICE_NUMA_BIND",
              "dra": "matchAttribute gpuslice.io/numaGroup"}  # fmt: skip
    for mode, to in served.items():
        for said in ("true", "TRUE", "false", "sometimes"):
            p = pod(ctr("c", {"nvidia.com/gpu": 2, "nvidia.com/gpumem": "1000"} if mode != "devicePlugin"
                          else {"nvidia.com/gpumem": "1000"}),
                    annotations={hami.NUMA_BIND: said, hami.VGPU_MODE: "hami-core"})  # fmt: skip
            r = rewrite(p, mode)
            out = jsonpatch.apply_patch(copy.deepcopy(p), r.patch)
            record = json.loads(out["metadata"]["annotations"][RECORD])
            bound = said.lower() == "true"
            assert record[hami.NUMA_BIND] == {"from": said, "to": to if bound else None}, (mode, said)
            assert record[hami.VGPU_MODE]["to"] is None
            env = {e["name"]: e["value"] for e in out["spec"]["containers"][0].get("env") or []}
            assert env.get("GPUSLICE_NUMA_BIND") == ("true" if bound and mode == "runtimeClass" else None), env
            if mode == "dra":
                [t] = r.templates
                constraints = t["spec"]["spec"]["devices"]["constraints"]
                assert ({"requests": ["gpu"], "matchAttribute": "gpuslice.io/numaGroup"} in constraints) is bound
                kubernetes_validate.validate({**t, "metadata": {**t["metadata"], "namespace": "ml"}}, "1.37",
                                             strict=True)  # fmt: skip
        with pytest.raises(errors.InvalidArgument) as e:
            rewrite(pod(ctr("c", {"nvidia.com/gpumem": "1000"}), annotations={hami.VGPU_MODE: "mig"}), mode)
        assert str(e.value) == ("nvidia.com/vgpu-mode: 'mig': gpuslice shares a GPU by time and memory limits, not "
                                "by MIG instances; accepted: hami-core, or no such annotation")  # fmt: skip

"""Who a container serves, read from the annotations each CRI runtime writes
into its OCI spec (allocator/oci.py workload_of), and a claim's workload
(dra/prepare.py workload_of): the metrics' namespace, pod and container."""

from __future__ import annotations

import json

from gpuslice.allocator import oci
from gpuslice.allocator.records import NO_WORKLOAD, Workload
from gpuslice.dra.prepare import workload_of as claim_workload


def test_containerds_cri_annotations_name_the_pod_and_container():
    notes = {"io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-namespace": "team-a",
             "io.kubernetes.cri.sandbox-name": "trainer-0", "io.kubernetes.cri.container-name": "main"}  # fmt: skip
    assert oci.workload_of(notes) == Workload("team-a", "trainer-0", "main")


def test_cri_o_annotations_or_its_labels_name_the_pod_and_container():
    notes = {"io.kubernetes.pod.namespace": "ns", "io.kubernetes.pod.name": "p", "io.kubernetes.container.name": "c"}
    assert oci.workload_of(notes) == Workload("ns", "p", "c")
    labels = {oci.CRIO_LABELS: json.dumps(notes)}
    assert oci.workload_of(labels) == Workload("ns", "p", "c")


def test_a_container_no_cri_made_serves_no_workload():
    assert oci.workload_of({"gpuslice.io/memory": "1Gi"}) == NO_WORKLOAD
    assert oci.workload_of({oci.CRIO_LABELS: "not json"}) == NO_WORKLOAD
    assert oci.workload_of({oci.CRIO_LABELS: '["a list"]'}) == NO_WORKLOAD
    assert not NO_WORKLOAD and Workload("ns")


def test_a_claims_workload_is_its_namespace_and_the_pod_it_is_reserved_for():
    claim = {
        "metadata": {"namespace": "ns", "name": "c"},
        "status": {"reservedFor": [{"resource": "pods", "name": "p-1", "uid": "u"}]},
    }
    got = claim_workload(claim)
    assert (got.namespace, got.pod, got.container) == ("ns", "p-1", "")
    assert claim_workload({"metadata": {"namespace": "ns"}}).pod == ""

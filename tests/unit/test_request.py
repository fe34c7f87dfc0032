"""The annotation contract (DESIGN.md), parsed in one place."""

from __future__ import annotations

import pytest

from gpuslice.request import ComputePolicy, MemoryLimit, Priority, RequestError, SliceRequest, gather, parse
from gpuslice.units import format_bytes, parse_bytes

UUID = "GPU-5e1c0a1d-0000-4000-8000-000000000000"


def test_no_annotations_means_no_request():
    assert parse({"io.kubernetes.pod.name": "x"}) is None


def test_full_request():
    r = parse(
        {
            "gpuslice.io/gpus": "2",
            "gpuslice.io/memory": "4Gi",
            "gpuslice.io/cores": "30",
            "gpuslice.io/compute-policy": "hard",
            "gpuslice.io/priority": "high",
            "gpuslice.io/device": f"0,{UUID}",
        }
    )
    assert r == SliceRequest(2, MemoryLimit(bytes=4 << 30), 30, ComputePolicy.HARD, Priority.HIGH, ("0", UUID))
    assert not r.whole_gpus


def test_defaults_and_percent_memory():
    r = parse({"gpuslice.io/memory": "25%"})
    assert r == SliceRequest(memory=MemoryLimit(percent=25))
    assert r.memory.resolve(16 << 30) == 4 << 30
    assert parse({"gpuslice.io/gpus": "1"}).whole_gpus
    assert parse({"gpuslice.io/cores": "100"}).whole_gpus
    assert not parse({"gpuslice.io/cores": "30"}).whole_gpus
    assert parse({"gpuslice.io/device": "0,1"}).gpus == 2


@pytest.mark.parametrize(
    ("annotations", "fragment"),
    [
        ({"gpuslice.io/memory": "lots"}, 'annotation gpuslice.io/memory: "lots" is not valid; accepted: bytes'),
        ({"gpuslice.io/memory": "0"}, "gpuslice.io/memory"),
        ({"gpuslice.io/memory": "150%"}, "percentage of the GPU from 1% to 100%"),
        ({"gpuslice.io/cores": "150"}, 'annotation gpuslice.io/cores: "150" is not valid; accepted: a whole number'),
        ({"gpuslice.io/cores": "0"}, "from 1 to 100"),
        ({"gpuslice.io/gpus": "-1"}, 'annotation gpuslice.io/gpus: "-1" is not valid'),
        ({"gpuslice.io/gpus": "two"}, "a whole number from 1 to 64"),
        ({"gpuslice.io/compute-policy": "fair"}, "accepted: elastic or hard"),
        ({"gpuslice.io/priority": "urgent"}, "accepted: high or normal or low"),
        ({"gpuslice.io/device": "gpu0"}, "GPU indices or UUIDs"),
        ({"gpuslice.io/device": "0,0"}, "each once"),
        ({"gpuslice.io/device": "0", "gpuslice.io/gpus": "2"}, "more GPUs than gpuslice.io/device pins (1)"),
        ({"gpuslice.io/memroy": "4Gi"}, "annotation gpuslice.io/memroy: unknown; accepted annotations:"),
    ],
)
def test_bad_values_give_one_line(annotations, fragment):
    with pytest.raises(RequestError) as e:
        parse(annotations)
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_units():
    assert parse_bytes("1500Mi") == 1500 << 20
    assert parse_bytes("2G") == 2 * 10**9
    assert parse_bytes("17179869184") == 16 << 30
    with pytest.raises(ValueError):
        parse_bytes("4 gigs")
    assert format_bytes(3 << 30) == "3.0 GiB" and format_bytes(512) == "512 B"


POD = {"gpuslice.io/memory": "4Gi", "gpuslice.io/containers": "trainer,eval"}


def test_environment_mirrors_annotations_and_annotations_win_key_by_key():
    asked = gather({"gpuslice.io/memory": "2Gi"}, ["PATH=/bin", "GPUSLICE_MEMORY=4Gi", "GPUSLICE_COMPUTE_POLICY=hard"])
    assert asked.values == {"gpuslice.io/memory": "2Gi", "gpuslice.io/compute-policy": "hard"}
    assert parse(asked.values, asked.sources) == SliceRequest(
        memory=MemoryLimit(bytes=2 << 30), policy=ComputePolicy.HARD
    )
    assert not gather({}, ["GPUSLICE=1", "GPUSLICE_UNKNOWN=3", "NVIDIA_VISIBLE_DEVICES=all"])


def test_a_bad_environment_value_names_the_variable():
    asked = gather({}, ["GPUSLICE_CORES=130"])
    with pytest.raises(RequestError) as e:
        parse(asked.values, asked.sources)
    assert str(e.value).startswith('environment variable GPUSLICE_CORES: "130" is not valid; accepted: a whole number')
    asked = gather({}, ["GPUSLICE_GPUS=3", "GPUSLICE_DEVICE=0"])
    with pytest.raises(RequestError, match=r"^environment variable GPUSLICE_GPUS: "):
        parse(asked.values, asked.sources)


@pytest.mark.parametrize("name_mark", ["io.kubernetes.cri.container-name", "io.kubernetes.container.name"])
def test_containers_names_which_containers_of_a_pod_get_the_request(name_mark):
    assert gather({**POD, name_mark: "eval"}).values == {"gpuslice.io/memory": "4Gi"}
    assert not gather({**POD, name_mark: "log-shipper"})  # a sidecar: no slice
    assert gather({"gpuslice.io/memory": "4Gi", name_mark: "any"}).values == {"gpuslice.io/memory": "4Gi"}


@pytest.mark.parametrize(
    ("value", "fragment"),
    [("", "is not valid"), ("Trainer", "is not valid"), ("a,,b", "is not valid"), ("x" * 64, "is not valid")],
)
def test_bad_containers_values_give_one_line(value, fragment):
    with pytest.raises(RequestError) as e:
        gather({"gpuslice.io/containers": value, "io.kubernetes.cri.container-name": "a"})
    assert str(e.value).startswith("annotation gpuslice.io/containers: ") and fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_containers_outside_a_pod_is_an_error_not_a_silent_match():
    with pytest.raises(RequestError, match="has no CRI container name"):
        gather(POD)


@pytest.mark.parametrize(
    ("annotations", "source"),
    [
        ({"gpuslice.io/gpus": "\uff11\uff16"}, "annotation gpuslice.io/gpus"),  # fullwidth digits
        ({"gpuslice.io/memory": "1\u0660\u0660\u0660"}, "annotation gpuslice.io/memory"),  # Arabic-Indic zeros
        ({"gpuslice.io/memory": "9" * 400}, "annotation gpuslice.io/memory"),  # was a float overflow
        ({"gpuslice.io/memory": "2000000Ti"}, "annotation gpuslice.io/memory"),  # above 1 PiB
        ({"gpuslice.io/cores": "\uff13\uff10"}, "annotation gpuslice.io/cores"),
        ({"gpuslice.io/cores": "30\n"}, "annotation gpuslice.io/cores"),
        ({"gpuslice.io/device": "\uff10"}, "annotation gpuslice.io/device"),
        ({"gpuslice.io/device": "0," * 2000 + "1"}, "annotation gpuslice.io/device"),
        ({"gpuslice.io/priority": "\uff48\uff49\uff47\uff48"}, "annotation gpuslice.io/priority"),
        ({"gpuslice.io/memory": "50 \uff05"}, "annotation gpuslice.io/memory"),
    ],
)
def test_only_ascii_and_bounded_values_are_accepted_with_one_short_line(annotations, source):
    with pytest.raises(RequestError) as e:
        parse(annotations)
    line = str(e.value)
    assert line.startswith(f"{source}: ") and "\n" not in line and line.isascii() and len(line) < 400


def test_bounds_that_still_hold():
    assert parse({"gpuslice.io/memory": "1024Ti"}).memory == MemoryLimit(bytes=1 << 50)
    assert parse({"gpuslice.io/memory": " 4 Gi "}).memory == MemoryLimit(bytes=4 << 30)
    with pytest.raises(ValueError, match="is more than 1 PiB"):
        parse_bytes("1025Ti")
    with pytest.raises(ValueError, match="is not a size"):
        parse_bytes("\u0663")

"""Placement alone (allocator/placement.py), as tables: the node's GPUs as they
are now, a request's annotations, and where it lands or why it cannot."""

from __future__ import annotations

import pytest

from gpuslice import request
from gpuslice.allocator.placement import CannotFit, GpuCapacity, NoRoom, place
from gpuslice.errors import Code, code_of

GiB = 1 << 30


def gpus(*free: tuple[int, int, int] | str, total: int = 16 * GiB) -> list[GpuCapacity]:
    """GPU i from (memory reserved GiB, cores reserved, slices) or "whole" (held whole)."""
    out = []
    for i, f in enumerate(free):
        uuid = f"GPU-{i}"
        if f == "whole":
            out.append(GpuCapacity(i, uuid, total, total, 100, 1, exclusive=True))
        else:
            assert not isinstance(f, str)
            out.append(GpuCapacity(i, uuid, total, f[0] * GiB, f[1], f[2]))
    return out


def pcie(a: int, b: int) -> int:
    """GPUs 0-1 and 2-3 share a PCIe switch; the pairs are far apart."""
    return 0 if a == b else 1 if a // 2 == b // 2 else 3


def req(**notes: str) -> request.SliceRequest:
    parsed = request.parse({request.PREFIX + k.replace("_", "-"): v for k, v in notes.items()})
    assert parsed is not None
    return parsed


EMPTY = ((0, 0, 0),) * 4
PLACED = [
    # (GPUs, request, placed on: [(index, memory GiB, cores)])
    (EMPTY, req(memory="4Gi", cores="30"), [(0, 4, 30)]),
    (((8, 50, 1), (0, 0, 0)), req(memory="4Gi", cores="30"), [(0, 4, 30)]),  # best fit: the fuller GPU
    (((14, 50, 1), (0, 0, 0)), req(memory="4Gi", cores="30"), [(1, 4, 30)]),  # 2 GiB left on GPU 0: too little
    (((4, 80, 1), (0, 0, 0)), req(memory="4Gi", cores="30"), [(1, 4, 30)]),  # GPU 0 has 20 cores left
    (((0, 0, 0), (0, 0, 0)), req(memory="25%"), [(0, 4, 0)]),  # a percentage of the GPU; memory only: no share
    (((0, 0, 0), (0, 0, 0)), req(cores="50"), [(0, 8, 50)]),  # cores only: memory in proportion
    (((2, 10, 1), (0, 0, 0)), req(gpus="1"), [(1, 16, 100)]),  # a whole GPU needs one nobody uses
    (EMPTY, req(gpus="2", memory="1Gi"), [(0, 1, 0), (1, 1, 0)]),  # two GPUs behind one switch
    (((15, 0, 1), (0, 0, 0), (0, 0, 0), (0, 0, 0)), req(gpus="2", memory="4Gi"), [(2, 4, 0), (3, 4, 0)]),
    (EMPTY, req(device="3", memory="1Gi"), [(3, 1, 0)]),  # pinned by index
    # spread (gpuslice.io/gpu-policy, HAMi's gpu-scheduler-policy): the emptiest that fits, not the fullest
    (((8, 50, 1), (0, 0, 0)), req(memory="4Gi", cores="30", gpu_policy="spread"), [(1, 4, 30)]),
    (((8, 50, 1), (4, 0, 2), (12, 0, 1)), req(memory="4Gi", gpu_policy="spread"), [(1, 4, 0)]),
    (((4, 0, 2), (4, 0, 1)), req(memory="4Gi", gpu_policy="spread"), [(1, 4, 0)]),  # as empty: fewer slices
    (((8, 50, 1), (0, 0, 0)), req(memory="4Gi", gpu_policy="binpack"), [(0, 4, 0)]),  # binpack: the default's
    (
        ((4, 50, 1), (8, 0, 1), (0, 0, 0)),
        req(memory="4Gi", device="0,1", gpus="1", gpu_policy="spread"),
        [(0, 4, 0)],
    ),  # the emptiest of those pinned
    (
        ((15, 0, 1), (0, 0, 0), (0, 0, 0), (0, 0, 0)),
        req(gpus="2", memory="4Gi", gpu_policy="spread"),
        [(2, 4, 0), (3, 4, 0)],
    ),  # several GPUs: the closest set first, as binpack's
]


@pytest.mark.parametrize(("node", "asked", "where"), PLACED)
def test_where_a_request_lands(node, asked, where):
    placed = place(asked, gpus(*node), pcie)
    assert [(p.index, p.memory // GiB, p.cores) for p in placed] == where


REFUSED = [
    # (GPUs, request, error kind, what the line says)
    (((0, 0, 0),), req(memory="17Gi"), CannotFit, "request needs 17.0 GiB per GPU, more than any GPU holds"),
    (((0, 0, 0),), req(gpus="2"), CannotFit, "request asks for 2 GPUs, node has 1"),
    (((0, 0, 0),) * 2, req(device="5"), CannotFit, "gpuslice.io/device: no GPU 5 on this node"),
    (((14, 0, 1),), req(memory="4Gi"), NoRoom, "no room for 1 x 4.0 GiB and 0 cores: GPU 0 (GPU-0): 2.0 GiB"),
    (((0, 90, 1),), req(memory="1Gi", cores="20"), NoRoom, "10 cores free"),
    (("whole", (0, 0, 0)), req(gpus="2", memory="1Gi"), NoRoom, "GPU 0 (GPU-0): held whole"),
    (((1, 10, 1),), req(gpus="1"), NoRoom, "no room for 1 x a whole GPU"),
]


@pytest.mark.parametrize(("node", "asked", "kind", "says"), REFUSED)
def test_what_cannot_be_placed_and_why(node, asked, kind, says):
    with pytest.raises(kind) as e:
        place(asked, gpus(*node), pcie)
    assert says in str(e.value)
    # nothing fits now -> RESOURCE_EXHAUSTED (may fit later); can never fit -> INVALID_ARGUMENT
    assert code_of(e.value) == (Code.RESOURCE_EXHAUSTED if kind is NoRoom else Code.INVALID_ARGUMENT)


def test_memory_oversubscription_lets_reservations_pass_the_total():
    node = gpus((14, 0, 1))
    with pytest.raises(NoRoom):
        place(req(memory="4Gi"), node, pcie)
    assert [p.index for p in place(req(memory="4Gi"), node, pcie, oversubscription=1.5)] == [0]


def named(*names: str) -> list[GpuCapacity]:
    """Idle GPUs with these product names, GPU i's UUID U(i)."""
    return [GpuCapacity(i, U(i), 16 * GiB, name=n) for i, n in enumerate(names)]


def U(i: int) -> str:
    return f"GPU-{i:08x}-0000-0000-0000-000000000000"


MIXED = ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L4")


@pytest.mark.parametrize(("asked", "where"), [
    (req(device_type="h100", memory="1Gi"), [1]),  # a word of the name, ignoring case (HAMi's use-gputype)
    (req(device_type="L4,H100", memory="1Gi"), [1]),  # any of the words; then best fit, then the lowest index
    (req(avoid_device_type="A100", gpus="2", memory="1Gi"), [1, 3]),
    (req(device_type="A100", avoid_device="0", memory="1Gi"), [2]),
    (req(avoid_device=f"{U(0)},1", memory="1Gi"), [2]),  # by UUID and by index
    (req(device="1,2", gpus="1", device_type="A100", memory="1Gi"), [2]),  # a pin and a type together: both hold
])  # fmt: skip
def test_a_requests_gpu_choice_narrows_where_it_lands(asked, where):
    assert [p.index for p in place(asked, named(*MIXED), pcie)] == where


def test_a_request_no_gpu_of_the_node_may_be_given_can_never_fit_here_and_says_why_of_each():
    with pytest.raises(CannotFit) as e:
        place(req(device_type="H200", memory="1Gi"), named(*MIXED[:2]), pcie)
    assert str(e.value) == (
        "no GPU of this node is one the request may be given (GPU 0: NVIDIA A100-SXM4-80GB, not of "
        "gpuslice.io/device-type H200; GPU 1: NVIDIA H100 80GB HBM3, not of gpuslice.io/device-type H200); it has "
        f"0 ({U(0)}, NVIDIA A100-SXM4-80GB), 1 ({U(1)}, NVIDIA H100 80GB HBM3)"
    )
    with pytest.raises(CannotFit, match="asks for 2 GPUs, may be given 1"):
        place(req(device_type="A100", gpus="2", memory="1Gi"), named(*MIXED[:2]), pcie)


@pytest.mark.parametrize(("notes", "says"), [
    ({"gpuslice.io/device-type": "A100;rm"}, 'annotation gpuslice.io/device-type: "A100;rm" is not valid'),
    ({"gpuslice.io/avoid-device-type": "a100,A100"}, "each once"),
    ({"gpuslice.io/device-type": ""}, "comma-separated words of a GPU's name"),
    ({"gpuslice.io/avoid-device": "GPU-x"}, "comma-separated GPU indices or UUIDs"),
    ({"gpuslice.io/gpu-policy": "topology-aware"},
     'annotation gpuslice.io/gpu-policy: "topology-aware" is not valid; accepted: binpack or spread'),
])  # fmt: skip
def test_a_bad_gpu_choice_is_one_line_naming_it(notes, says):
    with pytest.raises(request.RequestError) as e:
        request.parse({"gpuslice.io/memory": "1Gi", **notes})
    assert says in str(e.value) and "\n" not in str(e.value)


def two_sockets(a: int, b: int) -> bool:
    """GPUs 0-1 on NUMA node 0, 2-3 on node 1 (NVML: "node" within, "system" across)."""
    return a // 2 == b // 2


def nvlinked(a: int, b: int) -> int:
    """GPUs 1 and 2 joined by NVLink across the sockets: the closest pair, yet on two NUMA nodes."""
    return 0 if a == b else 1 if {a, b} == {1, 2} else 2 if a // 2 == b // 2 else 3


@pytest.mark.parametrize(("node", "notes", "where"), [
    (EMPTY, {"gpus": "2", "memory": "1Gi"}, [1, 2]),  # without numa-bind: the closest pair, across sockets
    (EMPTY, {"gpus": "2", "memory": "1Gi", "numa_bind": "true"}, [0, 1]),  # with it: one node's
    (((15, 0, 1), (0, 0, 0), (0, 0, 0), (0, 0, 0)), {"gpus": "2", "memory": "4Gi", "numa_bind": "true"}, [2, 3]),
    (EMPTY, {"gpus": "2", "memory": "1Gi", "numa_bind": "false"}, [1, 2]),
    (EMPTY, {"memory": "1Gi", "numa_bind": "true"}, [0]),  # one GPU: on one node whatever it is
])  # fmt: skip
def test_numa_bind_takes_a_multi_gpu_slice_s_gpus_from_one_numa_node(node, notes, where):
    placed = place(req(**notes), gpus(*node), nvlinked, same_numa=two_sockets)
    assert [p.index for p in placed] == where


def test_numa_bind_that_cannot_hold_says_whether_it_may_later():
    # GPUs 0 and 2 held: a pair is free, but across the sockets, so not now; it may be, later
    node = gpus((15, 0, 1), (0, 0, 0), (15, 0, 1), (0, 0, 0))
    assert [p.index for p in place(req(gpus="2", memory="4Gi"), node, nvlinked, same_numa=two_sockets)] == [1, 3]
    with pytest.raises(NoRoom) as e:
        place(req(gpus="2", memory="4Gi", numa_bind="true"), node, nvlinked, same_numa=two_sockets)
    assert str(e.value).startswith("no room for 2 x 4.0 GiB and 0 cores on one NUMA node (gpuslice.io/numa-bind): ")
    # three GPUs on one node never: the node has two on each
    with pytest.raises(CannotFit) as c:
        place(req(gpus="3", memory="1Gi", numa_bind="true"), gpus(*EMPTY), nvlinked, same_numa=two_sockets)
    assert str(c.value) == ("request asks for 3 GPUs on one NUMA node (gpuslice.io/numa-bind); the most the node "
                            "has on one is 2")  # fmt: skip
    with pytest.raises(request.RequestError) as bad:
        request.parse({"gpuslice.io/gpus": "2", "gpuslice.io/numa-bind": "yes"})
    assert str(bad.value) == 'annotation gpuslice.io/numa-bind: "yes" is not valid; accepted: true or false'

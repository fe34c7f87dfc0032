"""The device plugin's units and which a container gets (device_plugin/)."""

from __future__ import annotations

import pytest

from gpuslice import errors
from gpuslice.device_plugin import preference
from gpuslice.device_plugin import units as u
from gpuslice.device_plugin.preference import Partner

pytestmark = pytest.mark.unit

A, B = "GPU-aaaaaaaa-0000", "GPU-bbbbbbbb-0000"


def ids(gpu: str, resource: str, n: int, start: int = 0) -> list[str]:
    return [u.Unit(gpu, resource, i).id for i in range(start, start + n)]


def test_counts_and_ids_round_trip():
    assert [len(u.units(A, r, 80 * u.GIB + 123)) for r in u.RESOURCES] == [80, 100, 1]
    for unit in u.units(A, u.MEMORY, 4 * u.GIB):
        assert u.parse(unit.id) == unit
    with pytest.raises(errors.InvalidArgument, match="is not one of gpuslice's"):
        u.parse("nvidia0")


def test_an_8_by_80_gib_node_is_under_1500_devices():
    per_gpu = sum(u.count(r, 80 * u.GIB) for r in u.RESOURCES)
    assert 8 * per_gpu == 1448


def test_prefer_keeps_one_resource_on_one_gpu_and_binpacks():
    available = ids(A, u.MEMORY, 10) + ids(B, u.MEMORY, 4)
    got = preference.prefer(u.MEMORY, available, [], 3)
    assert set(u.by_gpu(got)) == {B}  # the fuller GPU that fits
    got = preference.prefer(u.MEMORY, available, [], 6)
    assert set(u.by_gpu(got)) == {A} and len(got) == 6


def test_prefer_follows_the_partner_resource_when_it_fits():
    available = ids(A, u.CORES, 100) + ids(B, u.CORES, 40)
    partner = Partner(u.MEMORY, A, 0.0)
    assert set(u.by_gpu(preference.prefer(u.CORES, available, [], 30, partner))) == {A}
    assert set(u.by_gpu(preference.prefer(u.CORES, available, [], 30, None))) == {B}
    same_kind = Partner(u.CORES, A, 0.0)  # only the other resource steers
    assert set(u.by_gpu(preference.prefer(u.CORES, available, [], 30, same_kind))) == {B}


def test_prefer_keeps_what_must_be_included():
    available = ids(A, u.MEMORY, 4) + ids(B, u.MEMORY, 8)
    kept = ids(A, u.MEMORY, 2)
    got = preference.prefer(u.MEMORY, available, kept, 3)
    assert got[:2] == kept and set(u.by_gpu(got)) == {A}


def test_a_size_no_single_gpu_has_is_one_line_naming_each_gpus_free_units():
    available = ids(A, u.MEMORY, 5) + ids(B, u.MEMORY, 6)
    with pytest.raises(errors.ResourceExhausted) as e:
        preference.prefer(u.MEMORY, available, [], 8)
    assert str(e.value) == f"8 gpuslice.io/memory must lie on one GPU; free: {A} has 5, {B} has 6"


def test_one_gpu_refuses_units_spanning_gpus():
    chosen = ids(A, u.MEMORY, 2) + ids(B, u.MEMORY, 1)
    assert preference.one_gpu(u.MEMORY, ids(A, u.MEMORY, 3), []) == A
    with pytest.raises(errors.FailedPrecondition, match=r"^3 gpuslice.io/memory must lie on one GPU; free: "):
        preference.one_gpu(u.MEMORY, chosen, ids(A, u.MEMORY, 1, start=5))


def test_several_whole_gpus_are_the_set_that_crosses_numa_nodes_least_then_the_closest():
    gpus = [f"GPU-{c * 8}-0000" for c in "abcd"]  # a-b and c-d each one NUMA node's; b-c NVLinked across

    def apart(x: str, y: str) -> tuple[int, int]:
        same = {x, y} in ({gpus[0], gpus[1]}, {gpus[2], gpus[3]})
        return (0, 40) if same else (1, 1) if {x, y} == {gpus[1], gpus[2]} else (1, 50)

    free = [i for g in gpus for i in ids(g, u.GPU, 1)]
    assert preference.prefer_whole(free, [], 2, apart) == sorted(ids(gpus[0], u.GPU, 1) + ids(gpus[1], u.GPU, 1))
    # a restarted container's kept GPU stays in the set, and the rest are chosen around it
    kept = ids(gpus[3], u.GPU, 1)
    assert preference.prefer_whole(free, kept, 2, apart) == sorted(ids(gpus[2], u.GPU, 1) + kept)
    assert len(preference.prefer_whole(free, [], 4, apart)) == 4
    with pytest.raises(errors.ResourceExhausted, match=r"5 gpuslice\.io/gpu: 4 free"):
        preference.prefer_whole(free, [], 5, apart)


def test_many_whole_gpus_are_grown_from_the_first_by_the_nearest():
    gpus = [f"GPU-{i:08x}-0000" for i in range(64)]
    free = [i for g in gpus for i in ids(g, u.GPU, 1)]

    def apart(x: str, y: str) -> tuple[int, int]:  # eight NUMA nodes of eight GPUs
        return (0, 40) if gpus.index(x) // 8 == gpus.index(y) // 8 else (1, 50)

    chosen = preference.prefer_whole(free, [], 8, apart)  # C(64, 8) sets: too many to weigh one by one
    assert chosen == sorted(i for g in gpus[:8] for i in ids(g, u.GPU, 1))

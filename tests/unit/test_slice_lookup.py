"""Which slice `gpuslice resize CONTAINER` names (cli/slice_lookup.py): a container's ID,
a unique start of one, or a slice's ID; anything else is one line saying what is accepted."""

from __future__ import annotations

import pytest

from gpuslice import errors
from gpuslice.cli.slice_lookup import find
from gpuslice.proto import gpuslice_pb2 as pb

SLICES = [pb.Slice(id="9f3a", container_id="abc123"), pb.Slice(id="77e0", container_id="abd456"),
          pb.Slice(id="ab", container_id="e5f6")]  # fmt: skip


@pytest.mark.parametrize(("ref", "container"), [
    ("abc123", "abc123"),  # the whole ID
    ("abc", "abc123"),  # a unique start
    ("abd", "abd456"),
    ("77e0", "abd456"),  # a slice's ID
    ("ab", "e5f6"),  # an exact ID (the slice's) wins over the start of two containers' IDs
])  # fmt: skip
def test_a_container_is_named_by_its_id_a_unique_start_of_it_or_its_slice(ref, container):
    assert find(SLICES, ref).container_id == container


@pytest.mark.parametrize(("ref", "kind", "line"), [
    ("a", errors.InvalidArgument,
     "'a' starts 2 slices' containers (abc123, abd456); accepted: a longer start or the whole ID"),
    ("zz", errors.NotFound,
     "no slice's container is or starts with 'zz' and no slice is 'zz' (gpuslice status lists them)"),
    ("", errors.InvalidArgument,
     "no container named; accepted: a container's ID, a unique start of one, or a slice's ID "
     "(gpuslice status lists them)"),
])  # fmt: skip
def test_an_ambiguous_or_unknown_name_is_one_line(ref, kind, line):
    with pytest.raises(kind) as e:
        find(SLICES, ref)
    assert str(e.value) == line


def test_an_ambiguous_start_names_at_most_five_containers():
    many = [pb.Slice(id=f"s{i}", container_id=f"c{i}") for i in range(7)]
    with pytest.raises(errors.InvalidArgument, match=r"starts 7 slices' containers \(c0, c1, c2, c3, c4, \.\.\.\)"):
        find(many, "c")

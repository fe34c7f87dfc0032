"""Which slice a command names: its container's ID, a unique start of one (as
`docker ps` shortens them), or the slice's own ID (as `gpuslice status` shows
both)."""

from __future__ import annotations

from collections.abc import Sequence

from gpuslice import errors
from gpuslice.proto import gpuslice_pb2 as pb

SHOWN = 5  # the most candidates named in the line of an ambiguous start


def find(slices: Sequence[pb.Slice], ref: str) -> pb.Slice:
    """The one slice `ref` names; an exact ID wins over a start of another."""
    if not ref:
        raise errors.InvalidArgument("no container named; accepted: a container's ID, a unique start of one, "
                                     "or a slice's ID (gpuslice status lists them)")  # fmt: skip
    for s in slices:
        if ref in (s.container_id, s.id):
            return s
    starting = [s for s in slices if s.container_id.startswith(ref)]
    if len(starting) == 1:
        return starting[0]
    if not starting:
        raise errors.NotFound(f"no slice's container is or starts with {ref!r} and no slice is {ref!r} "
                              "(gpuslice status lists them)")  # fmt: skip
    names = ", ".join(s.container_id for s in starting[:SHOWN]) + (", ..." if len(starting) > SHOWN else "")
    raise errors.InvalidArgument(f"{ref!r} starts {len(starting)} slices' containers ({names}); accepted: "
                                 "a longer start or the whole ID")  # fmt: skip

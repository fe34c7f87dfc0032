"""The simulated driver is a package of its own, gpuslice-sim (`sim/` in the
source tree), never part of a node install.  What asks for it here (a daemon
configured with `nvml: sim`, `cdi generate --driver sim`, `gpuslice sim`, the
demo) calls `require()` first, which says in one line which package to install
when it is missing, then imports `gpuslice_sim`."""

from __future__ import annotations

import importlib.util

from gpuslice.errors import FailedPrecondition

PACKAGE = "gpuslice_sim"
MISSING = (
    "the simulated driver is not installed: install the gpuslice-sim package "
    "(apt-get install gpuslice-sim, dnf install gpuslice-sim, or pip install 'gpuslice[sim]')"
)


class SimulatorMissing(FailedPrecondition):
    """gpuslice-sim is not installed."""


def require() -> None:
    """Raise SimulatorMissing unless gpuslice-sim can be imported."""
    if importlib.util.find_spec(PACKAGE) is None:
        raise SimulatorMissing(MISSING)

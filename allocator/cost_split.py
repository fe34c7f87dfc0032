"""Splitting a GPU's measured time among the slices that shared it, by what
each launched (docs/compute.md, "What the driver reports").

An H100 with driver 580 gives each per-process sample period to one process:
one sample, the whole GPU's use over the period, to the process that ran most
in it (tests/data/real-gpu/h100-2026-11-26/trace.json). While two slices
time-slice, NVML's per-process figures then say what the GPU as a whole did,
never who did it: read per process, the busier tenant was charged with
everything and the other with nothing, and hard 30 / 70 got 6.6 / 27.1 %.

What the daemon does know per slice is what it launched: the threads its gate
let through in the time each reading covers. A slice's GPU time is its
threads times its cost per thread. A cost is measured where it can be told
apart: while the slice runs alone on the GPU (every sample is then its own),
or, for a slice that joins others whose costs are known, as the GPU's time
less theirs, over its first readings. A reading is then split in proportion
to threads x cost, so the slices' figures always add up to what the GPU did:
a cost that is off by the same factor for every slice (a busier GPU, shared
caches) changes nothing, and the GPU's time is never lost or doubled."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

Key = tuple[str, int]  # (slice id, GPU index within the slice)

JOIN_SKIP = 2  # a joining slice's first readings are not measured: its launches run ahead of the GPU
JOIN_READINGS = 3  # ... then its cost is measured over at least this many
JOIN_WINDOW = 15  # ... and, while it is the last to have joined, over at most this many of the latest


@dataclass
class Joining:
    """The last slice to join: its cost is measured beside slices with known costs."""

    readings: int = 0
    measured: deque = field(default_factory=lambda: deque(maxlen=JOIN_WINDOW))  # (GPU ns less the others', threads)


@dataclass
class CostSplit:
    """One GPU's slices: their cost per launched thread, and the split of each reading."""

    costs: dict[Key, float] = field(default_factory=dict)  # ns of GPU time per thread
    learner: Key | None = None
    fallback: float | None = None  # the GPU's time per thread launched, over the latest reading
    joining: Joining = field(default_factory=Joining)

    def split(self, total_ns: float, threads: dict[Key, int], known: dict[Key, float]) -> dict[Key, float]:
        """Each slice's share of `total_ns`, the GPU time of a reading in which the
        slices launched `threads`. `known`: the cost a slice has from a time it ran
        alone, for one this split has no cost of."""
        out: dict[Key, float] = dict.fromkeys(threads, 0.0)
        launched = {k: t for k, t in threads.items() if t > 0}
        if launched and total_ns > 0:
            self.fallback = total_ns / sum(launched.values())
        for k in launched:
            if k not in self.costs and known.get(k):
                self.costs[k] = known[k]
        new = [k for k in launched if k not in self.costs]
        if len(new) == 1 and len(launched) > 1 and new[0] != self.learner:
            self.learner, self.joining = new[0], Joining()
        if (
            self.learner in launched
            and len(launched) > 1
            and all(o in self.costs for o in launched if o != self.learner)
        ):
            self._join(self.learner, total_ns, launched)
            new = [k for k in launched if k not in self.costs]
        weight = {k: t * self.costs[k] for k, t in launched.items() if k in self.costs}
        if new:  # what the known slices did not use, by threads among the others
            rest = max(0.0, total_ns - sum(weight.values()))
            unknown = sum(launched[k] for k in new)
            weight.update({k: rest * launched[k] / unknown for k in new})
        whole = sum(weight.values())
        if whole > 0:
            out.update({k: total_ns * w / whole for k, w in weight.items()})
        if log.isEnabledFor(logging.DEBUG):  # the line is built only for a daemon that logs it
            self._log(total_ns, threads, out)
        return out

    def _log(self, total_ns: float, threads: dict[Key, int], out: dict[Key, float]) -> None:
        log.debug("split %.1f ms: %s", total_ns / 1e6, " ".join(
            f"{k[0][:8]}/{k[1]} threads {t} cost {self.costs.get(k, 0.0):.4g}{' joining' if k == self.learner else ''}"
            f" {out[k] / 1e6:.1f} ms" for k, t in threads.items()))  # fmt: skip

    def forget(self, keep: set[Key]) -> None:
        """Slices gone from the GPU."""
        for k in set(self.costs) - keep:
            del self.costs[k]
        if self.learner is not None and self.learner not in keep:
            self.learner, self.joining = None, Joining()

    def _join(self, k: Key, total_ns: float, launched: dict[Key, int]) -> None:
        j = self.joining
        j.readings += 1
        if j.readings <= JOIN_SKIP:
            return
        j.measured.append(
            (max(0.0, total_ns - sum(t * self.costs[o] for o, t in launched.items() if o != k)), launched[k])
        )
        rest = sum(r for r, _ in j.measured)
        if len(j.measured) >= JOIN_READINGS and rest > 0:
            self.costs[k] = rest / sum(t for _, t in j.measured)

"""What the daemon's fits of the slices' costs saw, from its log (the kit turns on
GPUSLICE_DEBUG=gpuslice.allocator.cost_split): each fit's rows grouped by whose
boost they ran in, each group's time against what the costs fitted say it ran;
and the readings after the fit, against the same costs.

On the H200 (run 4) this is what showed that the rows in which the smaller slice
had its boost (the two loads the most even) took 6-10 % more time a thread than
the fit's other rows (the matmuls; the selftest's workers 3-8 %), and that once
fitted a full GPU's readings ran 8.8-11.4 % above the costs (docs/compute.md).
The kit adds it to each step's facts and rows; run on a log it prints one line
a fit, then one a steady stretch (the GPU's time a thread with one slice
launching, and with several):

    python tools/real-gpu/kit_fits.py tests/data/real-gpu/h200-2026-11-27/daemon-call3.log
"""

from __future__ import annotations

import functools
import re
import statistics
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field

ROWS = re.compile(r"fit rows \(ms: threads\): (.*)$")
FITTED = re.compile(r"costs fitted over .*? in [\d.]+ s: (.*?)(?:; shares .*)?$")
COST = re.compile(r"(\w+)/(\d+) ([\d.eE+-]+) ±([\d.]+)%")
SPLIT = re.compile(r"split ([\d.]+) ms: (.*)$")
PART = re.compile(r"(\w+)/(\d+) threads (\d+) cost ([\d.eE+-]+)( fitting)? ")
BEGIN = "fitting the costs"
REFINED = "cost measured again"  # one slice's cost changed: the readings after it are not the fit's
# ... nor after these: a fit for drift begins, or a slice of it is gone
ENDS = (BEGIN, REFINED, "costs drifted", "released slice")
MARKERS = (*ENDS, "fit rows", "costs fitted", "split ")  # the lines read() looks at
BOOSTED = 1.5  # a row whose slices' threads, each against its fewest in the fit, differ this much: one's boost
BASE = "base"


@dataclass
class Fit:
    """One fit: its slices (as the log names them), their costs (ns a thread) and the costs'
    relative errors, its rows (ms, each slice's threads), and the readings after it until the
    next fit: each as read (ms, the threads of those of its slices that launched), and where
    all of them launched, its ms against the costs' ms (`after`)."""

    keys: list[str]
    costs: list[float]
    errors: list[float]
    rows: list[tuple[float, list[int]]]
    readings: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    after: list[float] = field(default_factory=list)

    def predicted_ms(self, threads: list[int]) -> float:
        return sum(n * c for n, c in zip(threads, self.costs, strict=True)) / 1e6

    @functools.cached_property
    def fewest(self) -> list[int]:
        """Each slice's fewest threads in a row of the fit: its part without a boost, about."""
        return [max(1, min(r[1][i] for r in self.rows)) for i in range(len(self.keys))]

    def whose(self, threads: list[int]) -> str:
        """The slice whose boost a row ran in, or BASE (no one's)."""
        rel = [n / f for n, f in zip(threads, self.fewest, strict=True)]
        return self.keys[rel.index(max(rel))] if max(rel) >= BOOSTED * min(rel) else BASE

    def groups(self) -> dict[str, list[float]]:
        """Each group's rows: time against the fitted costs' time (1.0: as the costs say)."""
        out: dict[str, list[float]] = {}
        for ms, threads in self.rows:
            if (pred := self.predicted_ms(threads)) > 0:
                out.setdefault(self.whose(threads), []).append(ms / pred)
        return out

    def per_thread(self) -> dict[str, float]:
        """Each group's time a thread launched, in ns, whatever slice launched it: where the slices
        run the same kernels, what the mix of loads in a row does to a thread's time."""
        out: dict[str, list[tuple[float, int]]] = {}
        for ms, threads in self.rows:
            out.setdefault(self.whose(threads), []).append((ms, sum(threads)))
        return {k: 1e6 * sum(ms for ms, _ in v) / max(1, sum(n for _, n in v)) for k, v in out.items()}

    def summary(self) -> dict:
        groups = self.groups()
        return {
            "slices": self.keys,
            "costs": self.costs,
            "rows": len(self.rows),
            "row_groups": {k: len(v) for k, v in groups.items()},
            "groups_pct": {k: round(100 * (statistics.fmean(v) - 1), 2) for k, v in groups.items()},
            "thread_ns": {k: round(v, 5) for k, v in self.per_thread().items()},
            "after_pct": round(100 * (statistics.median(self.after) - 1), 2) if self.after else None,
            "after_readings": len(self.after),
        }


def read(lines: Iterable[str]) -> list[Fit]:
    """The fits a daemon log holds, each with the readings that followed it."""
    fits: list[Fit] = []
    rows: list[tuple[float, list[int]]] | None = None
    current: Fit | None = None
    for line in lines:
        if any(end in line for end in ENDS):
            current = None
        elif m := ROWS.search(line):
            rows = [(float(ms), [int(n) for n in threads.split(",")])
                    for ms, threads in (r.split(":") for r in m.group(1).split())]  # fmt: skip
        elif (m := FITTED.search(line)) and rows is not None:
            named = COST.findall(m.group(1))
            keys = [f"{s}/{g}" for s, g, _, _ in named]
            costs, errors = [float(c) for _, _, c, _ in named], [float(e) / 100 for _, _, _, e in named]
            if rows and all(len(r[1]) == len(keys) for r in rows):
                current = Fit(keys, costs, errors, rows)
                fits.append(current)
            rows = None
        elif current is not None and (m := SPLIT.search(line)):
            _after(current, float(m.group(1)), PART.findall(m.group(2) + " "))
    return fits


STRETCH = 5  # readings in a row, none while fitting, of the same slices launching: a stretch


@dataclass
class Stretch:
    """Readings in a row outside any fit with the same slices launching: the GPU's time a thread
    launched there, whatever slice launched it (where the slices run the same kernels, a thread's
    time alone against shared: on the H200 a matmul's was 4.02 ns alone, 4.31-4.36 shared)."""

    slices: tuple[str, ...]
    threads: int = 0
    busy: list[float] = field(default_factory=list)  # each reading's ms

    @property
    def readings(self) -> int:
        return len(self.busy)

    @property
    def ms(self) -> float:
        return sum(self.busy)

    def summary(self) -> dict:
        return {"slices": list(self.slices), "readings": self.readings,
                "thread_ns": round(1e6 * self.ms / max(1, self.threads), 5),
                "busy_ms_median": statistics.median(self.busy)}  # fmt: skip


def stretches(lines: Iterable[str]) -> list[Stretch]:
    """The log's steady stretches (STRETCH readings or more), in order."""
    out: list[Stretch] = []
    cur: Stretch | None = None
    for line in lines:
        m = SPLIT.search(line)
        if any(end in line for end in ENDS) or (m and " fitting " in m.group(2) + " "):
            cur = None
            continue
        if not m:
            continue
        parts = PART.findall(m.group(2) + " ")
        launched = {f"{sl}/{g}": int(n) for sl, g, n, _, _ in parts if int(n) > 0}
        if not launched:
            continue
        key = tuple(sorted(launched))
        if cur is None or cur.slices != key:
            cur = Stretch(key)
            out.append(cur)
        cur.threads += sum(launched.values())
        cur.busy.append(float(m.group(1)))
    return [st for st in out if st.readings >= STRETCH]


def _after(fit: Fit, ms: float, parts: list[tuple[str, str, str, str, str]]) -> None:
    """A reading after the fit, where its slices (or some of them) launched at the costs fitted."""
    threads = {f"{s}/{g}": int(n) for s, g, n, _, fitting in parts if not fitting}
    if len(threads) != len(parts) or not set(threads) <= set(fit.keys) or not any(threads.values()):
        return
    fit.readings.append((ms, threads))
    pred = fit.predicted_ms([threads.get(k, 0) for k in fit.keys])
    if set(threads) == set(fit.keys) and pred > 0:
        fit.after.append(ms / pred)


def describe(fit: Fit) -> str:
    """One line: the rows by whose boost they ran in, and the readings after."""
    s = fit.summary()
    groups = ", ".join(f"{'no boost' if k == BASE else k[:8] + ' boosted'} {v:+.1f} % ({s['row_groups'][k]})"
                       for k, v in sorted(s["groups_pct"].items()))  # fmt: skip
    threads = ", ".join(f"{'no boost' if k == BASE else k[:8] + ' boosted'} {v:.4g}"
                        for k, v in sorted(s["thread_ns"].items()))  # fmt: skip
    costs = " ".join(f"{k[:8]} {c:.4g}" for k, c in zip(fit.keys, fit.costs, strict=True))
    after = (f"{s['after_pct']:+.1f} % over {s['after_readings']} readings after" if s["after_pct"] is not None
             else "no readings after")  # fmt: skip
    return (
        f"{len(fit.keys)} slices, costs {costs}; rows against them: {groups}; a thread's ns in them: {threads}; {after}"
    )


def main(paths: list[str]) -> int:
    if not paths:
        print("usage: kit_fits.py DAEMON_LOG...", file=sys.stderr)
        return 2
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                fits = read(f)
        except OSError as e:
            print(f"{path}: {e.strerror}", file=sys.stderr)
            return 1
        for i, fit in enumerate(fits, 1):
            print(f"{path}: fit {i}: {describe(fit)}")
        if not fits:
            print(f"{path}: no fits (the daemon logs them with GPUSLICE_DEBUG=gpuslice.allocator.cost_split)")
        with open(path, encoding="utf-8", errors="replace") as f:
            for st in stretches(f):
                sm = st.summary()
                print(
                    f"{path}: {len(st.slices)} slice(s) launching, {st.readings} readings: a thread "
                    f"{sm['thread_ns']:.4g} ns, busy {sm['busy_ms_median']:.1f} ms a reading (median)"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

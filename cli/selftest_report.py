"""`gpuslice selftest`'s results: one row per check (what was expected, what was
observed, PASS/FAIL, or INFO for a fact that is neither), as a table or JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Check:
    name: str
    expected: str
    observed: str
    passed: bool | None  # None: a fact about the node, neither a pass nor a failure

    @property
    def verdict(self) -> str:
        return "INFO" if self.passed is None else "PASS" if self.passed else "FAIL"


def failed(name: str, expected: str, why: str) -> Check:
    return Check(name, expected, why, False)


def all_passed(checks: list[Check]) -> bool:
    return bool(checks) and all(c.passed is not False for c in checks)


def render(checks: list[Check]) -> str:
    rows = [("check", "expected", "observed", "")] + [(c.name, c.expected, c.observed, c.verdict) for c in checks]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r[:3], widths, strict=True)) + "  " + r[3] for r in rows]
    total = sum(c.passed is not None for c in checks)
    passed = sum(c.passed is True for c in checks)
    return "\n".join([*lines, "", f"{passed} of {total} checks passed"])


def as_json(checks: list[Check]) -> dict:
    return {"passed": all_passed(checks), "checks": [dict(asdict(c), verdict=c.verdict) for c in checks]}

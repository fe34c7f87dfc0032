"""The kit's results: one row per check (expected, observed, verdict), kept per
step so that a cut call resumes where it stopped, and written as one JSON and
one markdown table."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

PASS, FAIL, INFO, SKIP = "PASS", "FAIL", "INFO", "SKIP"


@dataclass(frozen=True)
class Row:
    step: str
    name: str
    expected: str
    observed: str
    verdict: str  # PASS, FAIL, INFO (a figure, neither), SKIP (with the reason in observed)


def check(step: str, name: str, expected: str, observed: str, ok: bool | None) -> Row:
    return Row(step, name, expected, observed, INFO if ok is None else PASS if ok else FAIL)


def skipped(step: str, name: str, why: str) -> Row:
    return Row(step, name, "", why, SKIP)


@dataclass
class StepResult:
    step: str
    rows: list[Row]
    seconds: float
    facts: dict = field(default_factory=dict)  # raw figures the rows came from


def save(result: StepResult, state: Path) -> None:
    path = state / "steps" / f"{result.step}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"step": result.step, "seconds": result.seconds, "facts": result.facts,
            "rows": [asdict(r) for r in result.rows]}  # fmt: skip
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)  # a call cut mid-write leaves the step undone, not half-recorded


def load(step: str, state: Path) -> StepResult | None:
    path = state / "steps" / f"{step}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return StepResult(step, [Row(**r) for r in data["rows"]], data["seconds"], data.get("facts", {}))


def summary(results: list[StepResult], pending: list[str]) -> dict[str, int]:
    rows = [r for res in results for r in res.rows]
    counts = {v: sum(r.verdict == v for r in rows) for v in (PASS, FAIL, INFO, SKIP)}
    return {**counts, "pending_steps": len(pending)}


def as_json(machine: dict, results: list[StepResult], pending: list[str]) -> dict:
    return {
        "machine": machine,
        "summary": summary(results, pending),
        "pending": pending,
        "steps": [{"step": r.step, "seconds": round(r.seconds, 1), "facts": r.facts} for r in results],
        "rows": [asdict(row) for r in results for row in r.rows],
    }


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def as_markdown(machine: dict, results: list[StepResult], pending: list[str]) -> str:
    counts = summary(results, pending)
    lines = ["# gpuslice real-GPU kit", ""]
    lines += [f"- {k}: {v}" for k, v in machine.items()]
    lines += ["", " · ".join(f"{k} {v}" for k, v in counts.items()), ""]
    lines += ["| step | check | expected | observed | |", "|---|---|---|---|---|"]
    for res in results:
        for r in res.rows:
            cells = (r.step, r.name, r.expected, r.observed, r.verdict)
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    if pending:
        lines += ["", f"Not run yet (call the kit again to resume): {', '.join(pending)}"]
    return "\n".join(lines) + "\n"

"""The kit's results: one row per check (expected, observed, verdict), kept per
step so that a cut call resumes where it stopped, and written as one JSON and
one markdown table. Every call's results stay in the state: a step run again
(--again) keeps its earlier runs beside the new one, and the report lists them
all, each with the call that ran it, so no GPU minute's rows are lost."""

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
    call: int = 0  # the kit's call that ran it (1, 2, ...: begin_call), 0 when not known


def begin_call(state: Path, about: dict) -> int:
    """This call's number, recorded with what it was (its date, options, gpuslice) in state/calls.json."""
    path = state / "calls.json"
    try:
        calls = json.loads(path.read_text())
    except (OSError, ValueError):
        calls = []
    number = len(calls) + 1
    calls.append({"call": number, **about})
    _write(path, calls)
    return number


def calls(state: Path) -> list[dict]:
    try:
        return list(json.loads((state / "calls.json").read_text()))
    except (OSError, ValueError):
        return []


def _write(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)  # a call cut mid-write leaves the step undone, not half-recorded


def _as_data(result: StepResult) -> dict:
    return {"step": result.step, "call": result.call, "seconds": result.seconds, "facts": result.facts,
            "rows": [asdict(r) for r in result.rows]}  # fmt: skip


def _from(data: dict) -> StepResult:
    return StepResult(
        data["step"], [Row(**r) for r in data["rows"]], data["seconds"], data.get("facts", {}), data.get("call", 0)
    )


def save(result: StepResult, state: Path) -> None:
    """The step's latest result; one it replaces (a step run again) is kept under steps/earlier/."""
    path = state / "steps" / f"{result.step}.json"
    earlier = load(result.step, state)
    if earlier is not None:
        kept = state / "steps" / "earlier" / f"{result.step}.{len(_earlier(result.step, state)) + 1}.json"
        _write(kept, _as_data(earlier))
    _write(path, _as_data(result))


def load(step: str, state: Path) -> StepResult | None:
    try:
        return _from(json.loads((state / "steps" / f"{step}.json").read_text()))
    except (OSError, ValueError, KeyError):
        return None


def _earlier(step: str, state: Path) -> list[StepResult]:
    found = []
    for path in (state / "steps" / "earlier").glob(f"{step}.*.json"):
        try:
            found.append((int(path.name.split(".")[-2]), _from(json.loads(path.read_text()))))
        except (OSError, ValueError, KeyError):
            continue
    return [r for _, r in sorted(found, key=lambda x: x[0])]


def load_all(state: Path, order: list[str]) -> list[StepResult]:
    """Every result the state holds, from every call: by step in `order`, earlier runs first."""
    out = []
    for step in order:
        latest = load(step, state)
        out += _earlier(step, state) + ([latest] if latest else [])
    return out


def summary(results: list[StepResult], pending: list[str]) -> dict[str, int]:
    rows = [r for res in results for r in res.rows]
    counts = {v: sum(r.verdict == v for r in rows) for v in (PASS, FAIL, INFO, SKIP)}
    return {**counts, "pending_steps": len(pending)}


def as_json(machine: dict, results: list[StepResult], pending: list[str], history: list[dict] | None = None) -> dict:
    return {
        "machine": machine,
        "calls": history or [],
        "summary": summary(results, pending),
        "pending": pending,
        "steps": [{"step": r.step, "call": r.call, "seconds": round(r.seconds, 1), "facts": r.facts} for r in results],
        "rows": [{**asdict(row), "call": r.call} for r in results for row in r.rows],
    }


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _overruns(facts: object) -> dict[str, str]:
    """Every probe that overran, wherever a step's facts keep it (a case's facts sit under its label)."""
    found: dict[str, str] = {}
    if isinstance(facts, dict):
        for k, v in facts.items():
            found.update(v if k == "overruns" and isinstance(v, dict) else _overruns(v))
    return found


def as_markdown(machine: dict, results: list[StepResult], pending: list[str], history: list[dict] | None = None) -> str:
    counts = summary(results, pending)
    lines = ["# gpuslice real-GPU kit", ""]
    lines += [f"- {k}: {v}" for k, v in machine.items()]
    for c in history or []:
        lines.append(f"- call {c['call']}: " + ", ".join(f"{k} {v}" for k, v in c.items() if k != "call"))
    lines += ["", " · ".join(f"{k} {v}" for k, v in counts.items()), ""]
    lines += ["| call | step | check | expected | observed | |", "|---|---|---|---|---|---|"]
    for res in results:
        for r in res.rows:
            cells = (str(res.call or ""), r.step, r.name, r.expected, r.observed, r.verdict)
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    if pending:
        lines += ["", f"Not run yet (call the kit again to resume): {', '.join(pending)}"]
    for res in results:
        for what, text in _overruns(res.facts).items():
            lines += ["", f"## {res.step} (call {res.call}): {what} overran", "", "```", text.rstrip(), "```"]
    return "\n".join(lines) + "\n"

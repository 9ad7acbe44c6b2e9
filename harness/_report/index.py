"""The directory's ``index.md``: the gate's decision on top (or a line saying no gate decided),
the totals, then one row per saved run, failures first, each run summed up by its most severe
finding (ranked as ``Verdict.worst`` ranks them) with its size in its own unit: a reading for an
out-of-memory, a change for the others. It reads the runs' JSON documents (as
:mod:`harness._results.artifacts` writes them) as plain mappings, so any value in them may be
missing or malformed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness._core.markdown import code, link_to, plain, strong, table, text
from harness._core.units import format_size
from harness._core.wording import plural
from harness._verdict.model import Finding, Kind, Status

REGRESSION = "REGRESSION"
SHOWN = (Status.PASS, REGRESSION, Status.FAIL, Status.ERROR)
"""What the index's Verdict column may show, mildest first."""


@dataclass(frozen=True)
class GateDecision:
    """What ``leakgate gate`` decided for a folder, shown above its index's table: the verdict
    and its totals, when it was decided, the baseline and tolerance compared with (None when no
    baseline was given), each regressed verdict's reasons by file name, every problem, and the
    verdicts that had no base."""

    passed: bool
    totals: str
    baseline: str | None = None
    tolerance: str = ""
    regressions: Mapping[str, Sequence[str]] = field(default_factory=dict)
    problems: Sequence[str] = ()
    unmatched: Sequence[str] = ()
    decided: float = field(default_factory=time.time)


def index_lines(
    entries: list[tuple[Path, dict[str, Any]]],
    unreadable: int,
    decision: GateDecision | None = None,
) -> list[str]:
    """The lines of ``index.md`` for ``entries`` (a verdict JSON's path and its document);
    ``unreadable`` counts the JSON files that were not verdicts; ``decision`` is the gate's,
    when a gate wrote it: a verdict that passed its rules but regressed shows as REGRESSION."""
    shown = {path: shown_status(path, doc, decision) for path, doc in entries}
    entries = sorted(entries, key=lambda e: (-SHOWN.index(shown[e[0]]), run_title(*e)))
    counts = {s: sum(status == s for status in shown.values()) for s in SHOWN}
    worst = {path: worst_finding(doc) for path, doc in entries}
    total = f"**{plural(len(entries), 'traced run')}: "
    total += " · ".join(
        f"{counts[s]} {s}" for s in SHOWN if s != REGRESSION or decision is not None
    )
    total += "**"
    ranked = [(f, path, doc) for path, doc in entries if (f := worst[path]) is not None]
    if ranked:
        top, path, doc = min(ranked, key=lambda r: worst_order(r[0]))
        total += f" · most severe: {text(finding_text(top))} ({code(run_title(path, doc))})"
    lines = ["# leakgate memory verdicts", "", *decision_lines(decision), total, ""]
    if unreadable:
        skipped = (
            "1 JSON file here is not a leakgate verdict and was skipped."
            if unreadable == 1
            else f"{unreadable} JSON files here are not leakgate verdicts and were skipped."
        )
        lines += [skipped, ""]
    if not entries:
        return [*lines, "No traced run."]
    rows = []
    for path, doc in entries:
        status = shown[path]
        report = doc.get("report")
        report = report if isinstance(report, str) and report else f"{path.stem}.md"
        plain_name = plain(report) == report and "/" not in report and "\\" not in report
        exists = plain_name and (path.parent / report).is_file()
        most = worst[path]
        rows.append(
            (
                strong(status) if status != Status.PASS else status,
                code(run_title(path, doc)),
                finding_text(most) if most is not None else "none",
                findings_cell(doc.get("findings")),
                link_to(report, report) if exists else "n/a",
            )
        )
    header = ("Verdict", "Run", "Most severe finding", "Findings", "Report")
    return lines + table(header, rows)


def decision_lines(decision: GateDecision | None) -> list[str]:
    """The gate's decision as the index opens with it: its verdict, totals, time, baseline and
    tolerance, then every regression and problem as a list; without a decision, a line saying
    that these are the runs' own verdicts, compared with no baseline."""
    if decision is None:
        return [
            "No baseline was compared: these are the runs' own verdicts, not a gate's decision "
            "(`leakgate gate DIR --baseline BASE` decides and rewrites this page).",
            "",
        ]
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(decision.decided))
    against = "no baseline"
    if decision.baseline is not None:
        against = f"the baseline {code(decision.baseline)} (tolerance {decision.tolerance})"
    verdict = strong(f"Gate: {Status.PASS if decision.passed else Status.FAIL}")
    lines = [f"{verdict}: {text(decision.totals)}; decided {when} against {against}.", ""]
    regressions = [
        f"- {code(name)}: {text(reason)}"
        for name, reasons in sorted(decision.regressions.items())
        for reason in reasons
    ]
    for title, items in (
        ("Regressions against the baseline", regressions),
        ("Problems", [f"- {text(problem)}" for problem in decision.problems]),
    ):
        if items:
            lines += [f"## {title}", "", *items, ""]
    if decision.unmatched:
        names = ", ".join(code(name) for name in decision.unmatched)
        lines += [f"No baseline for {plural(len(decision.unmatched), 'verdict')}: {names}.", ""]
    return lines


def shown_status(path: Path, doc: Mapping[str, Any], decision: GateDecision | None) -> str:
    """A run's Verdict cell: its status, or REGRESSION where it passed its rules and the gate
    found it regressed against its base; a status that is not one reads as ERROR."""
    status = doc.get("status")
    if status not in SHOWN or status == REGRESSION:
        return Status.ERROR
    if status == Status.PASS and decision is not None and path.name in decision.regressions:
        return REGRESSION
    return str(status)


def findings(doc: Mapping[str, Any]) -> list[Finding]:
    """The findings of a verdict document that read as findings."""
    found = []
    raw = doc.get("findings")
    for item in raw if isinstance(raw, list) else ():
        try:
            found.append(Finding.from_dict(item))
        except (TypeError, ValueError):
            continue
    return found


def worst_finding(doc: Mapping[str, Any]) -> Finding | None:
    """The most severe finding of a verdict document, as :meth:`Verdict.worst` chooses it."""
    return min(findings(doc), key=worst_order, default=None)


def worst_order(finding: Finding) -> tuple[bool, int, int]:
    """:meth:`Verdict.worst`'s order: blocking first, then P0 before P1, then larger."""
    return (not finding.blocking, -finding.severity.rank, -(size(finding) or 0))


def finding_text(finding: Finding) -> str:
    """``P0 leak in validation epoch 0: +34.0MiB``; ``P0 oom in validation: 3.9GiB in use``
    (not escaped)."""
    where = plain(finding.phase, 120) if finding.phase else "the run"
    if finding.epoch is not None:
        where += f" epoch {finding.epoch}"
    text = f"{finding.severity} {finding.kind} in {where}"
    return text + (f": {amount}" if (amount := amount_text(finding)) else "")


def amount_text(finding: Finding) -> str:
    """A finding's bytes in their own unit: a change, signed; the reading at an OOM, not."""
    nbytes = size(finding)
    if nbytes is None:
        return ""
    if finding.kind == Kind.OOM:
        return f"{format_size(nbytes)} in use"
    return format_size(nbytes, signed=True)


def findings_cell(raw: Any) -> str:
    """Every finding of a run: severity, kind, phase and bytes in their own unit (not
    escaped)."""
    if not isinstance(raw, list):
        return "none"
    parts = []
    for finding in findings({"findings": raw}):
        amount = amount_text(finding)
        parts.append(
            f"{finding.severity} {finding.kind} ({plain(finding.phase or 'run', 120)}"
            + (f", {amount}" if amount else "")
            + ")"
        )
    return "; ".join(parts) or "none"


def run_title(path: Path, doc: Mapping[str, Any]) -> str:
    """What a run is called in the index: its test id, title or name, else its file's stem
    (on one line, not escaped)."""
    for key in ("test", "title", "name"):
        if isinstance(doc.get(key), str) and (name := plain(doc[key])):
            return name
    return plain(path.stem)


def size(finding: Finding) -> int | None:
    """A finding's bytes when they are a finite number, else None."""
    value = finding.bytes
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if math.isfinite(value) else None

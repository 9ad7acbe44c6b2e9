"""The directory's ``index.md``: totals on top, then one row per saved run, failures first,
each run summed up by its most severe finding (ranked as ``Verdict.worst`` ranks them) with its
size in its own unit: a reading for an out-of-memory, a change for the others. It reads the
runs' JSON documents (as :mod:`harness.artifacts` writes them) as plain mappings, so any value
in them may be missing or malformed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.markdown import code, link_to, plain, strong, table, text
from harness.units import format_size
from harness.verdict import Finding, Kind, Status


def index_lines(entries: list[tuple[Path, dict[str, Any]]], unreadable: int) -> list[str]:
    """The lines of ``index.md`` for ``entries`` (a verdict JSON's path and its document);
    ``unreadable`` counts the JSON files that were not verdicts."""
    entries = sorted(entries, key=lambda e: (-status_rank(e[1].get("status")), run_name(*e)))
    counts = {s: sum(doc.get("status") == s for _, doc in entries) for s in ("FAIL", "ERROR")}
    passed = sum(doc.get("status") == "PASS" for _, doc in entries)
    worst = {path: worst_finding(doc) for path, doc in entries}
    total = f"**{len(entries)} traced run{'s' * (len(entries) != 1)}: {passed} PASS"
    total += f" · {counts['FAIL']} FAIL · {counts['ERROR']} ERROR**"
    ranked = [(f, path, doc) for path, doc in entries if (f := worst[path]) is not None]
    if ranked:
        top, path, doc = min(ranked, key=lambda r: rank(r[0]))
        total += f" · most severe: {text(finding_text(top))} ({code(run_name(path, doc))})"
    lines = ["# leakgate memory verdicts", "", total, ""]
    if unreadable:
        lines += [f"{unreadable} JSON file(s) here are not leakgate verdicts and were skipped.", ""]
    if not entries:
        return [*lines, "No traced run."]
    rows = []
    for path, doc in entries:
        status = str(doc.get("status"))
        report = doc.get("report")
        report = report if isinstance(report, str) and report else f"{path.stem}.md"
        plain_name = plain(report) == report and "/" not in report and "\\" not in report
        exists = plain_name and (path.parent / report).is_file()
        most = worst[path]
        rows.append(
            (
                strong(status) if status != "PASS" else status,
                code(run_name(path, doc)),
                finding_text(most) if most is not None else "none",
                findings_cell(doc.get("findings")),
                link_to(report, report) if exists else "n/a",
            )
        )
    header = ("Verdict", "Run", "Most severe finding", "Findings", "Report")
    return lines + table(header, rows)


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
    return min(findings(doc), key=rank, default=None)


def rank(finding: Finding) -> tuple[bool, int, int]:
    """:meth:`Verdict.worst`'s order: blocking first, then P0 before P1, then larger."""
    return (not finding.blocking, -finding.severity.rank, -(size(finding) or 0))


def status_rank(status: Any) -> int:
    """How severe a document's status is (:attr:`Status.rank`); one that is not a status
    ranks as ERROR."""
    try:
        return Status(status).rank
    except ValueError:
        return Status.ERROR.rank


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


def run_name(path: Path, doc: Mapping[str, Any]) -> str:
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

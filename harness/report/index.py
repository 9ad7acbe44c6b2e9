"""The directory's ``index.md``: totals on top, then one row per saved run, failures first.

It is rendered from the runs' JSON documents (as written by :mod:`harness.artifacts`), so it
reads plain mappings and treats every value in them as possibly missing or malformed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.units import format_size


def index_lines(entries: list[tuple[Path, dict[str, Any]]], unreadable: int) -> list[str]:
    """The lines of ``index.md`` for ``entries`` (a verdict JSON's path and its document);
    ``unreadable`` counts the JSON files that were not verdicts."""
    order = {"ERROR": 0, "FAIL": 1, "PASS": 2}
    entries = sorted(entries, key=lambda e: (order.get(e[1].get("status"), 0), run_name(*e)))
    counts = {s: sum(doc.get("status") == s for _, doc in entries) for s in ("FAIL", "ERROR")}
    passed = sum(doc.get("status") == "PASS" for _, doc in entries)
    growths = [
        (g, run_name(p, d))
        for p, d in entries
        if (g := as_number(d.get("worst_growth"))) is not None
    ]
    total = f"**{len(entries)} traced run{'s' * (len(entries) != 1)}: {passed} PASS"
    total += f" · {counts['FAIL']} FAIL · {counts['ERROR']} ERROR**"
    if growths:
        growth, where = max(growths)
        total += f" · worst growth {format_size(growth, signed=True)} (`{where}`)"
    lines = ["# leakgate memory verdicts", "", total, ""]
    if unreadable:
        lines += [f"{unreadable} JSON file(s) here are not leakgate verdicts and were skipped.", ""]
    if not entries:
        return [*lines, "No traced run."]
    lines += ["| Verdict | Run | Worst growth | Findings | Report |", "|---|---|---|---|---|"]
    for path, doc in entries:
        status = str(doc.get("status"))
        growth = as_number(doc.get("worst_growth"))
        report = doc.get("report") or f"{path.stem}.md"
        link = f"[{report}]({report})" if (path.parent / report).exists() else "n/a"
        cells = [
            f"**{status}**" if status != "PASS" else status,
            f"`{run_name(path, doc)}`",
            format_size(growth, signed=True) if growth is not None else "n/a",
            findings_cell(doc.get("findings")),
            link,
        ]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines


def findings_cell(findings: Any) -> str:
    """Every finding of a run: severity, kind, phase and bytes."""
    if not isinstance(findings, list) or not findings:
        return "none"
    parts = []
    for f in findings:
        if not isinstance(f, Mapping):
            continue
        where = f.get("phase") or "run"
        size = as_number(f.get("bytes"))
        amount = f", {format_size(size, signed=f.get('kind') != 'oom')}" if size is not None else ""
        parts.append(f"{f.get('severity', '?')} {f.get('kind', '?')} ({where}{amount})")
    return "; ".join(parts) or "none"


def run_name(path: Path, doc: Mapping[str, Any]) -> str:
    """What a run is called in the index: its test id, title or name, else its file's stem."""
    for key in ("test", "title", "name"):
        if isinstance(doc.get(key), str) and doc[key]:
            return " ".join(doc[key].split())
    return path.stem


def as_number(value: Any) -> float | None:
    """``value`` as a float when it is a finite number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None

"""Baselines: the gate's rule for one verdict, shared by ``leakgate gate`` and the pytest plugin,
and a session's verdicts kept, found and summarised.

A verdict fails the gate when its status is not PASS, or when it regressed against its base
(:func:`harness.artifacts.compare_runs`: the same tolerance and noise floor everywhere). A
baseline is a folder of verdict files named as the run's (``<test>.json``); from pytest it is
kept under ``.leakgate/<NAME>/`` in the rootdir or in a folder the user names. The session
summary (``--memreport-json``) is documented in ``reports/README.md``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from harness.artifacts import (
    DEFAULT_MIN_BYTES,
    DEFAULT_TOLERANCE,
    Change,
    Comparison,
    compare_runs,
    load_run_document,
)
from harness.errors import BadInput
from harness.fsio import write_atomic
from harness.naming import safe_name
from harness.report import GateDecision
from harness.units import format_mib, format_size
from harness.wording import plural

SUMMARY_SCHEMA = "leakgate-session/1"
PHASE_FIELDS = ("phase", "epoch", "metric", "status", "growth", "slope", "peak_rise", "budget")


@dataclass(frozen=True)
class Judged:
    """One verdict as the gate sees it: its status, and its comparison with a base (None when
    there is no base for it)."""

    status: str
    comparison: Comparison | None = None

    @property
    def regressed(self) -> bool:
        return self.comparison is not None and self.comparison.regressed

    @property
    def failed(self) -> bool:
        return self.status != "PASS" or self.regressed


def judge_verdict(
    new: Mapping[str, Any],
    base: Mapping[str, Any] | None = None,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    min_bytes: int = DEFAULT_MIN_BYTES,
) -> Judged:
    """The gate's rule for one verdict document, against its base document when there is one."""
    comparison = None
    if base is not None:
        comparison = compare_runs(base, new, tolerance=tolerance, min_bytes=min_bytes)
    return Judged(str(new.get("status", "?")), comparison)


def missing_from_run(baseline: Iterable[str], run: Iterable[str]) -> list[str]:
    """The baseline's verdict names that the run did not produce: each fails the gate."""
    return sorted(set(baseline) - set(run))


def check_name(name: str) -> str:
    """A baseline's name: a plain folder name (no separator, not ``.`` or ``..``)."""
    if not name or name in (".", "..") or "/" in name or os.sep in name:
        raise BadInput(f"expected a plain name, got {name!r}", field="baseline name")
    return name


def find_baseline(storage: Path, given: str) -> Path:
    """The folder ``given`` names: a path when it has a separator (``./nightly``), else a name
    under ``storage``. ``BadInput`` unless it is a folder holding at least one verdict."""
    named = os.sep in given or "/" in given
    folder = Path(given) if named else storage / check_name(given)
    if not folder.exists():
        saved = sorted(p.name for p in storage.iterdir() if p.is_dir()) if storage.is_dir() else []
        known = f"; saved: {', '.join(saved)}" if saved else f"; none saved in {storage}"
        raise BadInput(f"no such baseline{'' if named else known}", path=folder)
    if not folder.is_dir():
        raise BadInput("a baseline must be a folder of verdicts, not a file", path=folder)
    if not any(folder.glob("*.json")):
        raise BadInput("no verdicts in this baseline", path=folder)
    return folder


@dataclass(frozen=True)
class SessionOptions:
    """What a pytest session does with its verdicts at its end: the baseline folder it compares
    with, the one it saves into, the summary file."""

    compare: Path | None
    save: Path | None
    json: Path | None


def session_options(
    save: str | None, compare: str | None, summary: str | None, storage: Path, memreport: bool
) -> SessionOptions:
    """``--memreport-save``, ``--memreport-compare`` and ``--memreport-json`` checked: ``BadInput``
    for a baseline that is not there, a storage or summary path of the wrong kind, or a baseline
    option without the report folder its verdicts are read from."""
    if (save is not None or compare is not None) and not memreport:
        flag = "--memreport-save" if save is not None else "--memreport-compare"
        raise BadInput("needs --memreport (the verdicts it keeps or compares)", field=flag)
    if (save is not None or compare is not None) and storage.exists() and not storage.is_dir():
        raise BadInput("not a folder", path=storage, field="--memreport-storage")
    if summary is not None and (not summary or Path(summary).is_dir()):
        raise BadInput(
            "expected a file path, got a folder", path=summary or ".", field="--memreport-json"
        )
    return SessionOptions(
        find_baseline(storage, compare) if compare is not None else None,
        storage / check_name(save) if save is not None else None,
        Path(summary) if summary is not None else None,
    )


def save_baseline(folder: Path, documents: Mapping[str, Mapping[str, Any]]) -> list[Path]:
    """Write each verdict document to ``folder/<name>``, atomically; a verdict already there
    for another test is kept. ``OSError`` names the file that could not be written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, document in sorted(documents.items()):
        text = json.dumps(document, indent=2, default=str) + "\n"
        written.append(write_atomic(folder / name, text))
    return written


def phase_numbers(phases: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each judged phase's numbers that a trend reads: growth, slope and peak rise."""
    return [{key: phase.get(key) for key in PHASE_FIELDS} for phase in phases]


def comparison_summary(comparison: Comparison) -> dict[str, Any]:
    """A comparison as JSON: whether it regressed, and every value compared."""
    return {
        "regressed": comparison.regressed,
        "base_status": comparison.base_status,
        "new_status": comparison.new_status,
        "tolerance": comparison.tolerance,
        "min_bytes": comparison.min_bytes,
        "changes": [
            {
                "item": c.item,
                "metric": c.metric,
                "base": c.base,
                "new": c.new,
                "per_batch": c.per_batch,
                "regression": c.regression,
            }
            for c in comparison.changes
        ],
    }


def session_summary(
    tests: Iterable[Mapping[str, Any]],
    *,
    baseline: Path | None,
    missing: Iterable[str] = (),
    saved: Path | None = None,
) -> dict[str, Any]:
    """The ``--memreport-json`` document: one entry per traced test, then the comparison's
    outcome (``baseline`` null when none was compared)."""
    entries = list(tests)
    lost = list(missing)
    regressed = [t["test"] for t in entries if (t.get("comparison") or {}).get("regressed")]
    return {
        "schema": SUMMARY_SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tests": entries,
        "baseline": None if baseline is None else str(baseline),
        "saved": None if saved is None else str(saved),
        "regressions": regressed,
        "missing": lost,
        "failed": any(t["verdict"] != "PASS" for t in entries) or bool(regressed or lost),
    }


class Outcome(Protocol):
    """What the session knows of one traced test (the plugin's outcomes)."""

    nodeid: str
    status: str
    worst_growth: float | None
    phases: list[dict[str, Any]]


@dataclass(frozen=True)
class Closed:
    """A session's end: the terminal lines, whether the session fails for them, and the
    comparison's decision for the index (None when no baseline was compared)."""

    lines: list[str]
    failed: bool
    decision: GateDecision | None = None


def close_session(
    outcomes: Iterable[Outcome],
    directory: Path | None,
    compare: Path | None,
    save: Path | None,
    summary: Path | None,
) -> Closed:
    """Compare the session's verdicts (``directory/<test>.json``) with the baseline folder
    ``compare`` by the gate's rule, save them into ``save``, and write the summary, each when
    given. The session fails on a regression, a baseline verdict it did not produce, or a
    verdict, baseline or summary that could not be read or written."""
    outcomes = sorted(outcomes, key=lambda o: o.nodeid)
    lines: list[str] = []
    failed = False
    documents: dict[str, dict[str, Any]] = {}
    if directory is not None and (compare is not None or save is not None):
        for o in outcomes:
            try:
                documents[o.nodeid] = load_run_document(directory / f"{safe_name(o.nodeid)}.json")
            except ValueError as exc:
                lines.append(f"leakgate REGRESSION unreadable verdict: {exc}")
                failed = True
    judged: dict[str, Judged] = {}
    missing: list[str] = []
    decision = None
    if compare is not None:
        base = {path.name: path for path in sorted(compare.glob("*.json"))}
        for nodeid, new in documents.items():
            path = base.get(f"{safe_name(nodeid)}.json")
            try:
                judged[nodeid] = judge_verdict(new, load_run_document(path) if path else None)
            except ValueError as exc:
                lines.append(f"leakgate REGRESSION unreadable baseline: {exc}")
                failed = True
        names = {f"{safe_name(nodeid)}.json" for nodeid in documents}
        missing = missing_from_run(base, names)
        regressed = [nodeid for nodeid, j in judged.items() if j.regressed]
        for nodeid in regressed:
            lines.append(f"leakgate REGRESSION {nodeid} against the baseline {compare}")
            lines += [f"    {line}" for line in regression_lines(judged[nodeid].comparison)]
        problems = [
            f"missing from the run: {name} is in the baseline {compare} "
            "but no test of this session wrote it"
            for name in missing
        ]
        lines += [f"leakgate REGRESSION {problem}" for problem in problems]
        unmatched = [f"{safe_name(n)}.json" for n, j in judged.items() if j.comparison is None]
        totals = (
            f"{len(regressed)} of {len(judged)} verdicts regressed, {len(missing)} missing, "
            f"{len(unmatched)} without a base"
        )
        lines.append(
            f"leakgate baseline {compare}: {'FAIL' if regressed or missing else 'PASS'}: {totals}"
        )
        failed = failed or bool(regressed or missing)
        decision = GateDecision(
            not failed and all(o.status == "PASS" for o in outcomes),
            totals,
            baseline=str(compare),
            tolerance=tolerance_text(DEFAULT_TOLERANCE, DEFAULT_MIN_BYTES),
            regressions={
                f"{safe_name(n)}.json": regression_lines(judged[n].comparison) for n in regressed
            },
            problems=problems,
            unmatched=unmatched,
        )
    if save is not None:
        try:
            files = save_baseline(save, {f"{safe_name(k)}.json": v for k, v in documents.items()})
            lines.append(f"leakgate: saved {plural(len(files), 'verdict')} as the baseline {save}")
        except OSError as exc:
            lines.append(f"leakgate warning: the baseline was not saved ({_os_error(exc)})")
            failed = True
    if summary is not None:
        tests = [
            {
                "test": o.nodeid,
                "verdict": o.status,
                "worst_growth": o.worst_growth,
                "phases": phase_numbers(o.phases),
                "comparison": _comparison_of(judged.get(o.nodeid)),
            }
            for o in outcomes
        ]
        document = session_summary(tests, baseline=compare, missing=missing, saved=save)
        try:
            summary.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(summary, json.dumps(document, indent=2) + "\n")
            lines.append(f"leakgate: session summary in {summary}")
        except OSError as exc:
            lines.append(f"leakgate warning: the summary was not written ({_os_error(exc)})")
            failed = True
    return Closed(lines, failed, decision)


def _comparison_of(judged: Judged | None) -> dict[str, Any] | None:
    if judged is None or judged.comparison is None:
        return None
    return comparison_summary(judged.comparison)


def regression_lines(comparison: Comparison | None) -> list[str]:
    """Why one verdict regressed: nothing in common with its base, a status that passed there
    and not here, each value beyond the tolerance (what, phase and metric, base -> now, what
    was allowed)."""
    if comparison is None:
        return []
    if comparison.nothing_compared:
        return ["nothing compared: no judged phase or teardown check in common with the base"]
    lines = []
    if comparison.status_regressed:
        lines.append(f"status {comparison.base_status} -> {comparison.new_status}")
    lines += [
        f"{c.item} ({c.metric}): {_size(c, c.base)} -> {_size(c, c.new)}, more than "
        f"{comparison.tolerance:.0%} and {_size(c, c.floor)} allowed"
        for c in comparison.regressions
    ]
    return lines


def _size(change: Change, value: float | None) -> str:
    return format_size(value) + ("/batch" if change.per_batch else "")


def tolerance_text(tolerance: float, min_bytes: int) -> str:
    """The growth a comparison allows: ``10% and 1.0 MiB``."""
    return f"{tolerance:.0%} and {format_mib(min_bytes)}"


def _os_error(error: OSError) -> str:
    return f"{error.filename or ''}: {error.strerror or error}".lstrip(": ")

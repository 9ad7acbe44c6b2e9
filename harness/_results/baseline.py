"""Baselines: the gate's rule for one verdict, shared by ``leakgate gate`` and the pytest plugin,
and a session's verdicts kept, found and summarised.

A verdict fails the gate when its status is not PASS, or when it regressed against its base
(:func:`harness._results.artifacts.compare_runs`: the same tolerance and noise floor everywhere). A
baseline is a folder of verdict files named as the run's (``<test>.json``); from pytest it is
kept under ``.leakgate/<NAME>/`` in the rootdir or in a folder the user names, with a
:data:`MANIFEST` written last, so that a save cut short is never read as a whole baseline. The
session summary (``--memreport-json``) is documented in ``reports/README.md``; it is written
atomically, or through to a device or FIFO (:func:`harness._core.fsio.write_output`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harness._core.errors import BadInput
from harness._core.fsio import (
    check_regular,
    make_folder,
    make_folders,
    same_folder,
    write_atomic,
    write_output,
)
from harness._core.json_values import read_json
from harness._core.naming import safe_name
from harness._core.units import format_mib, format_size
from harness._core.wording import plural
from harness._report.index import GateDecision
from harness._results.artifacts import (
    DEFAULT_MIN_BYTES,
    DEFAULT_TOLERANCE,
    Change,
    Comparison,
    compare_runs,
    load_run_document,
    verdict_files,
)
from harness._verdict.model import Status

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
        return self.status != Status.PASS or self.regressed


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


MANIFEST = "baseline.manifest"
"""The file that says what a saved baseline holds: ``{"schema": ..., "verdicts": [names]}``,
written last. While a save runs it lists nothing and says ``"saving": true``, so a save that
a full disk or a kill cut short leaves a baseline that says it is incomplete."""
MANIFEST_SCHEMA = "leakgate-baseline/1"


def save_baseline(folder: Path, documents: Mapping[str, Mapping[str, Any]]) -> list[Path]:
    """Write each verdict document to ``folder/<name>``, atomically, then the folder's
    :data:`MANIFEST` listing every verdict there (one already there for another test is kept).
    ``OSError`` names the file that could not be written, or the folder when a link has its
    name (never followed)."""
    make_folder(folder)
    _write_manifest(folder, {"saving": True})
    written = []
    for name, document in sorted(documents.items()):
        text = json.dumps(document, indent=2, default=str) + "\n"
        written.append(write_atomic(folder / name, text))
    _write_manifest(folder, {"verdicts": [path.name for path in verdict_files(folder)]})
    return written


def _write_manifest(folder: Path, content: Mapping[str, Any]) -> None:
    write_atomic(folder / MANIFEST, json.dumps({"schema": MANIFEST_SCHEMA, **content}) + "\n")


def baseline_verdicts(folder: Path) -> dict[str, Path]:
    """A baseline's verdicts by file name. A folder without a :data:`MANIFEST` is a plain
    folder of verdicts (``leakgate gate --baseline``'s); one with a manifest holds exactly what
    it lists. ``BadInput`` naming the folder for an incomplete baseline (a save cut short, a
    verdict listed and gone, one there and not listed), one that cannot be trusted (a verdict
    that is not a regular file: a FIFO would block its reader, a folder has no verdict) or a
    manifest that cannot be read."""
    found = {path.name: path for path in verdict_files(folder)}
    for path in found.values():
        try:
            check_regular(path)
        except OSError as exc:
            problem = f"untrustworthy baseline: {path.name}: {exc.strerror or exc}"
            raise BadInput(problem, path=folder) from None
    manifest = folder / MANIFEST
    if not os.path.lexists(manifest):
        return found
    document = read_json(manifest)
    if not isinstance(document, dict) or document.get("schema") != MANIFEST_SCHEMA:
        raise BadInput(f"not a leakgate manifest ({MANIFEST_SCHEMA})", path=manifest)
    listed = document.get("verdicts")
    if not isinstance(listed, list):
        raise BadInput("incomplete baseline: its save did not finish", path=folder)
    names = {name for name in listed if isinstance(name, str)}
    if names != set(found) or len(names) != len(listed):
        differences = [f"listed, not there: {name}" for name in sorted(names - set(found))]
        differences += [f"there, not listed: {name}" for name in sorted(set(found) - names)]
        raise BadInput(
            f"incomplete baseline: not what its manifest lists ({'; '.join(differences)})",
            path=folder,
        )
    return found


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
        "failed": any(t["verdict"] != Status.PASS for t in entries) or bool(regressed or lost),
    }


class GatedTest(Protocol):
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
    outcomes: Iterable[GatedTest],
    directory: Path | None,
    compare: Path | None,
    save: Path | None,
    summary: Path | None,
) -> Closed:
    """Compare the session's verdicts (``directory/<test>.json``) with the baseline folder
    ``compare`` by the gate's rule, save them into ``save``, and write the summary, each when
    given. The session fails on a regression, a baseline verdict it did not produce, or a
    verdict, baseline or summary that could not be read or written. A session that failed its
    comparison is never saved over the baseline it was compared with (the summary's ``saved``
    is then null): comparing with a baseline and saving into it is a ratchet, moved only by a
    session that passed."""
    outcomes = sorted(outcomes, key=lambda o: o.nodeid)
    closing = _Closing()
    documents: dict[str, dict[str, Any]] = {}
    if directory is not None and (compare is not None or save is not None):
        documents = _session_verdicts(outcomes, directory, closing)
    compared = _Compared()
    if compare is not None:
        compared = _compare_session(outcomes, documents, compare, closing)
    saved = _save_session(documents, save, compare, closing)
    if summary is not None:
        _write_summary(summary, outcomes, compared, compare, saved, closing)
    return Closed(closing.lines, closing.failed, compared.decision)


@dataclass
class _Closing:
    """A session's end as it is worked out: its terminal lines so far, and whether it fails."""

    lines: list[str] = field(default_factory=list)
    failed: bool = False

    def fail(self, line: str) -> None:
        """Say ``line``; the session fails for it."""
        self.lines.append(line)
        self.failed = True


@dataclass(frozen=True)
class _Compared:
    """A session's verdicts against a baseline: each judged by the gate's rule, the baseline's
    verdicts the session did not produce, and the decision for the index (None when no
    baseline was compared)."""

    judged: dict[str, Judged] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    decision: GateDecision | None = None


def _session_verdicts(
    outcomes: Sequence[GatedTest], directory: Path, closing: _Closing
) -> dict[str, dict[str, Any]]:
    """Each test's verdict document read from ``directory``; one that cannot be read fails."""
    documents = {}
    for o in outcomes:
        try:
            documents[o.nodeid] = load_run_document(directory / f"{safe_name(o.nodeid)}.json")
        except ValueError as exc:
            closing.fail(f"leakgate REGRESSION unreadable verdict: {exc}")
    return documents


def _compare_session(
    outcomes: Sequence[GatedTest],
    documents: Mapping[str, Mapping[str, Any]],
    compare: Path,
    closing: _Closing,
) -> _Compared:
    """The session's verdicts judged against the baseline ``compare``: a line for each
    regression and each verdict missing from the run, then the totals; and the decision."""
    base = _baseline_of(compare, closing)
    judged = _judged(documents, base, closing)
    missing = missing_from_run(base, {f"{safe_name(nodeid)}.json" for nodeid in documents})
    regressed = [nodeid for nodeid, j in judged.items() if j.regressed]
    for nodeid in regressed:
        closing.lines.append(f"leakgate REGRESSION {nodeid} against the baseline {compare}")
        closing.lines += [f"    {line}" for line in regression_lines(judged[nodeid].comparison)]
    problems = [
        f"missing from the run: {name} is in the baseline {compare} "
        "but no test of this session wrote it"
        for name in missing
    ]
    closing.lines += [f"leakgate REGRESSION {problem}" for problem in problems]
    unmatched = [f"{safe_name(n)}.json" for n, j in judged.items() if j.comparison is None]
    totals = (
        f"{len(regressed)} of {len(judged)} verdicts regressed, {len(missing)} missing, "
        f"{len(unmatched)} without a base"
    )
    outcome = Status.FAIL if regressed or missing else Status.PASS
    closing.lines.append(f"leakgate baseline {compare}: {outcome}: {totals}")
    closing.failed = closing.failed or bool(regressed or missing)
    decision = GateDecision(
        not closing.failed and all(o.status == Status.PASS for o in outcomes),
        totals,
        baseline=str(compare),
        tolerance=tolerance_text(DEFAULT_TOLERANCE, DEFAULT_MIN_BYTES),
        regressions={
            f"{safe_name(n)}.json": regression_lines(judged[n].comparison) for n in regressed
        },
        problems=problems,
        unmatched=unmatched,
    )
    return _Compared(judged, missing, decision)


def _baseline_of(compare: Path, closing: _Closing) -> dict[str, Path]:
    """The baseline's verdicts by file name; none when it cannot be read, which fails."""
    try:
        return baseline_verdicts(compare)
    except BadInput as exc:
        closing.fail(f"leakgate REGRESSION unreadable baseline: {exc}")
        return {}


def _judged(
    documents: Mapping[str, Mapping[str, Any]], base: Mapping[str, Path], closing: _Closing
) -> dict[str, Judged]:
    """Each verdict by the gate's rule, against its base where the baseline has one; a base
    that cannot be read fails."""
    judged = {}
    for nodeid, new in documents.items():
        path = base.get(f"{safe_name(nodeid)}.json")
        try:
            judged[nodeid] = judge_verdict(new, load_run_document(path) if path else None)
        except ValueError as exc:
            closing.fail(f"leakgate REGRESSION unreadable baseline: {exc}")
    return judged


def _save_session(
    documents: Mapping[str, Mapping[str, Any]],
    save: Path | None,
    compare: Path | None,
    closing: _Closing,
) -> Path | None:
    """Save the verdicts into ``save``, unless the session failed its comparison with that
    very baseline; the baseline the summary names as saved (None when it was kept as it was).
    A save that fails, fails the session."""
    if save is not None and closing.failed and compare is not None and same_folder(save, compare):
        # Saved over, the baseline would pass the retry of the session that failed against it.
        closing.lines.append(
            f"leakgate: the baseline {save} was kept as it was: this session failed its "
            "comparison with it and is not saved over it"
        )
        return None
    if save is not None:
        try:
            files = save_baseline(save, {f"{safe_name(k)}.json": v for k, v in documents.items()})
            closing.lines.append(
                f"leakgate: saved {plural(len(files), 'verdict')} as the baseline {save}"
            )
        except OSError as exc:
            closing.fail(f"leakgate warning: the baseline was not saved ({_os_error(exc)})")
    return save


def _write_summary(
    summary: Path,
    outcomes: Sequence[GatedTest],
    compared: _Compared,
    compare: Path | None,
    saved: Path | None,
    closing: _Closing,
) -> None:
    """Write the session summary (:func:`session_summary`) to ``summary``; a write that fails,
    fails the session."""
    tests = [
        {
            "test": o.nodeid,
            "verdict": o.status,
            "worst_growth": o.worst_growth,
            "phases": phase_numbers(o.phases),
            "comparison": _comparison_of(compared.judged.get(o.nodeid)),
        }
        for o in outcomes
    ]
    document = session_summary(tests, baseline=compare, missing=compared.missing, saved=saved)
    try:
        make_folders(summary.parent)
        write_output(summary, json.dumps(document, indent=2) + "\n")
        closing.lines.append(f"leakgate: session summary in {summary}")
    except OSError as exc:
        closing.fail(f"leakgate warning: the summary was not written ({_os_error(exc)})")


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

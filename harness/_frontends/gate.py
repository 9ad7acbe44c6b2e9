"""``leakgate gate`` and ``leakgate index``: a folder of verdicts and timelines checked against a
baseline, one line per verdict and per problem, and the folder's ``index.md``.

The gate's exit code is the decision: 0 every verdict passes and nothing regressed, 1 a verdict
fails, a value regressed or a run is missing, stale or incomplete; bad input (an unreadable or
odd file, no verdicts at all) raises :class:`~harness._core.errors.BadInput` for the CLI to map, and
``index.md`` then says that the gate refused the folder, so that no earlier decision outlives it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness._core.errors import BadInput, UnwritableReport, as_bad_input, as_unwritable
from harness._core.fsio import write_atomic
from harness._core.markdown import strong, text
from harness._core.units import format_mib, format_size
from harness._core.wording import plural
from harness._report.index import REGRESSION, GateDecision
from harness._results.artifacts import (
    INDEX,
    Change,
    Comparison,
    load_run_document,
    verdict_files,
    write_index,
)
from harness._results.baseline import (
    baseline_verdicts,
    judge_verdict,
    missing_from_run,
    regression_lines,
    tolerance_text,
)
from harness._results.finish import unfinished
from harness._results.merge import gate_problems
from harness._timeline.jsonl import read_timeline
from harness._verdict.model import Status

if TYPE_CHECKING:
    from harness._history.creep import CreepLimit

PASS, FAIL = 0, 1
TABLE_ROWS = 20


def write_index_to(directory: Path, decision: GateDecision | None = None) -> Path:
    """Write ``directory``'s ``index.md`` (with the gate's ``decision`` when one was made) and
    say so; bad input unless it is a folder."""
    if not directory.is_dir():
        raise BadInput("not a directory", path=directory)
    try:
        path = write_index(directory, decision=decision)
    except OSError as exc:
        raise as_unwritable(exc, directory) from None
    print(f"wrote {path}")
    return path


def write_refusal(directory: Path, reason: BadInput | UnwritableReport) -> None:
    """Replace ``directory``'s ``index.md`` (a job summary may show it) with one that says the
    gate refused the folder and why, so that an earlier decision is never shown as this one's.
    Best effort: the refusal itself is what the gate reports."""
    if not directory.is_dir():
        return
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    lines = [
        "# leakgate memory verdicts",
        "",
        f"{strong('Gate: REFUSED')}: {text(reason)}; decided {when}. No verdict here counts "
        "until this is fixed and the gate runs again.",
    ]
    with contextlib.suppress(OSError):
        write_atomic(directory / INDEX, "\n".join(lines) + "\n")


@dataclass(frozen=True)
class Gated:
    """The gate's decision (as ``index.md`` shows it) and its lines for the terminal."""

    decision: GateDecision
    lines: list[str]
    documents: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)


def gate_folder(
    directory: Path,
    baseline_dir: Path | None,
    *,
    tolerance: float,
    min_bytes: int,
    history: str | None = None,
    max_creep: CreepLimit | None = None,
) -> int:
    """Decide on DIR (:func:`decide_gate`), append its verdicts to ``history`` and judge their
    creep (:func:`with_history`), write its ``index.md`` with the decision, then print one
    line per verdict, one per problem, and the total. Input the gate refuses writes nothing but
    an ``index.md`` that says so (:func:`write_refusal`)."""
    try:
        if max_creep is not None and history is None:
            raise BadInput("needs --history (the runs it judges)", field="--max-creep")
        gated = decide_gate(directory, baseline_dir, tolerance=tolerance, min_bytes=min_bytes)
        if history is not None:
            gated = with_history(gated, history, max_creep, min_bytes=min_bytes)
    except (BadInput, UnwritableReport) as exc:  # a history that cannot be written: refused too
        write_refusal(directory, exc)
        raise
    write_index_to(directory, gated.decision)
    for line in gated.lines:
        print(line)
    return PASS if gated.decision.passed else FAIL


def decide_gate(
    directory: Path, baseline_dir: Path | None, *, tolerance: float, min_bytes: int
) -> Gated:
    """Check every verdict and timeline in DIR, and DIR against the baseline, writing nothing.

    A verdict or timeline the gate cannot read is bad input (exit 2, one line naming it), and
    so is one that is not a regular file (a FIFO, a socket, a link to a device), refused before
    it is opened: the gate cannot know what that run decided, and a FIFO would block it. It is
    not skipped with a problem line, because exit 1 tells CI that the memory regressed, while
    this is a broken folder to be fixed, as an unreadable verdict is."""
    if not directory.is_dir():
        raise BadInput("not a directory", path=directory)
    baseline = _baseline(baseline_dir) if baseline_dir is not None else None
    verdicts = verdict_files(directory)
    timelines = sorted(directory.glob("*.jsonl"))
    if not verdicts and not timelines:
        raise BadInput("no verdicts to gate", path=directory)
    docs = {path.name: _load(path) for path in verdicts}
    problems = [line for path in timelines for line in _timeline_problems(path, docs)]
    failed = 0
    lines = []
    regressions: dict[str, list[str]] = {}
    for path in verdicts:
        new = docs[path.name]
        base = _load(baseline[path.name]) if baseline and path.name in baseline else None
        judged = judge_verdict(new, base, tolerance=tolerance, min_bytes=min_bytes)
        if judged.comparison is not None and judged.regressed:
            regressions[path.name] = regression_lines(judged.comparison)
            status = REGRESSION if judged.status == Status.PASS else judged.status
            line = f"{status:<5} {path.name} ({judged.status} by its rules, regressed against "
            line += "the baseline)\n"
            line += "\n".join(f"    {x}" for x in comparison_lines(judged.comparison))
        else:
            line = f"{judged.status:<5} {path.name}"
            line += " (no baseline)" if baseline is not None and base is None else ""
        failed += judged.failed
        lines.append(line)
    unmatched: list[str] = []
    if baseline is not None:
        problems += [
            f"missing from the run: {name} is in the baseline {baseline_dir} but not in {directory}"
            for name in missing_from_run(baseline, docs)
        ]
        unmatched = sorted(docs.keys() - baseline.keys())
        if unmatched:
            lines.append(
                f"no baseline for {plural(len(unmatched), 'verdict')}: {', '.join(unmatched)}"
            )
    totals = f"{failed} of {len(verdicts)} verdicts fail"
    if problems:
        totals += f", {plural(len(problems), 'problem')}"
    passed = not failed and not problems
    lines += [*problems, f"gate: {Status.PASS if passed else Status.FAIL}: {totals}"]
    decision = GateDecision(
        passed,
        totals,
        baseline=None if baseline_dir is None else str(baseline_dir),
        tolerance=tolerance_text(tolerance, min_bytes),
        regressions=regressions,
        problems=problems,
        unmatched=unmatched,
    )
    return Gated(decision, lines, docs)


def with_history(
    gated: Gated, given: str, max_creep: CreepLimit | None, *, min_bytes: int
) -> Gated:
    """Append the gated verdicts to the history at ``given`` as one run, then, with
    ``max_creep``, fail the gate for each test whose memory crept (one problem line each)."""
    from harness._history.archive import history_summary
    from harness._history.gating import creep_lines, record

    history, rows = record(given, [history_summary(d) for d in gated.documents.values()], "gate")
    lines = [*gated.lines[:-1], f"history: appended {plural(len(rows), 'run')} to {given}"]
    if max_creep is None:
        return Gated(gated.decision, [*lines, gated.lines[-1]], gated.documents)
    found = creep_lines(history, rows, max_creep, min_bytes=min_bytes)
    problems = [*gated.decision.problems, *found.crept]
    passed = gated.decision.passed and not found.crept
    totals = gated.decision.totals
    if found.crept:
        totals += f", {plural(len(found.crept), 'creep')}"
    decision = dataclasses.replace(gated.decision, passed=passed, totals=totals, problems=problems)
    outcome = Status.PASS if passed else Status.FAIL
    lines += [*found.notes, *found.crept, f"gate: {outcome}: {totals}"]
    return Gated(decision, lines, gated.documents)


def _baseline(folder: Path) -> dict[str, Path]:
    """The baseline's verdicts by file name; bad input unless it is a folder holding some."""
    if not folder.is_dir():
        what = "not a directory" if folder.exists() else "no such directory"
        raise BadInput(what, path=folder, field="baseline")
    found = baseline_verdicts(folder)
    if not found:
        raise BadInput("no verdicts in it", path=folder, field="baseline")
    return found


def _load(path: Path) -> dict[str, Any]:
    try:
        return load_run_document(path)
    except ValueError as exc:
        raise as_bad_input(exc) from None


def _timeline_problems(path: Path, docs: dict[str, dict[str, Any]]) -> list[str]:
    """What stops a timeline's run from counting: no verdict beside it, a verdict from another
    run (a killed run leaves the previous run's verdict in place), or a run that did not end
    (no end record, nor, in a timeline older than end records, its end checkpoint).
    A rank's timeline needs its run's merged verdict
    (:func:`~harness._results.merge.gate_problems`), and a verdict of its own, when there is one,
    from the same run."""
    try:
        timeline = read_timeline(path)
    except OSError as exc:
        raise BadInput(f"cannot read ({exc.strerror or exc})", path=path) from None
    except ValueError as exc:
        if path.stat().st_size == 0:
            return [f"incomplete run: {path.name} is empty (the run stopped as it started)"]
        raise as_bad_input(exc) from None
    problems = []
    verdict = path.with_suffix(".json").name
    doc = docs.get(verdict)
    run_id = timeline.header.get("run_id")
    rank = gate_problems(path, timeline.header, docs)  # a rank's timeline: its run's verdict
    if rank is not None:
        problems += rank
    if doc is None and rank is None:
        problems.append(f"missing verdict: {path.name} has no {verdict}")
    elif doc is not None and doc.get("run_id") != run_id:
        problems.append(
            f"stale verdict: {verdict} is from run {doc.get('run_id') or 'unknown'}, "
            f"{path.name} from run {run_id or 'unknown'}"
        )
    if timeline.end is None and unfinished(timeline) is not None:
        epochs = [s.epoch for s in timeline.samples if s.epoch is not None]
        problems.append(
            f"incomplete run: {path.name} ended at checkpoint {len(timeline.samples)} "
            f"(epoch {epochs[-1] if epochs else 'none'})"
        )
    return problems


def comparison_lines(comparison: Comparison) -> list[str]:
    """A summary line, then a small table: every value beyond the tolerance (or, when none is,
    the three largest changes)."""
    c = comparison
    limit = tolerance_text(c.tolerance, c.min_bytes)
    regressions = c.regressions
    if c.nothing_compared:
        return [
            "compare: NOTHING COMPARED: BASE and NEW have no judged phase or teardown check in "
            f"common (0 values compared); status {c.base_status} -> {c.new_status}"
        ]
    verdict = "REGRESSION" if c.regressed else "OK"
    lines = [
        f"compare: {verdict}: {len(regressions)} of {len(c.changes)} values grew by more than "
        f"{limit}; status {c.base_status} -> {c.new_status}"
        + (" (a regression)" if c.status_regressed else "")
    ]
    if c.only_in_base or c.only_in_new:
        lines.append(
            f"not compared: {plural(c.only_in_base, 'value')} only in BASE, {c.only_in_new} only "
            "in NEW"
        )
    beyond = regressions + sorted(
        (x for x in c.changes if x.improvement), key=lambda x: x.delta or 0
    )
    shown = beyond or sorted(c.changes, key=lambda x: -abs(x.delta or 0))[:3]
    if not shown:
        return lines
    if not beyond:
        lines.append("largest changes, all within tolerance:")
    rows = [("value", "metric", "base", "new", "change", "")]
    rows += [_change_row(x) for x in shown[:TABLE_ROWS]]
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    for r in rows:
        cells = [f"{r[0]:<{widths[0]}}", f"{r[1]:<{widths[1]}}"]
        cells += [f"{r[i]:>{widths[i]}}" for i in (2, 3, 4)] + [r[5]]
        lines.append("  ".join(cells).rstrip())
    if len(shown) > TABLE_ROWS:
        lines.append(f"... {len(shown) - TABLE_ROWS} more")
    return lines


def _change_row(change: Change) -> tuple[str, str, str, str, str, str]:
    """A table row; a percentage only where the base is at least the noise floor, else the
    absolute change alone."""
    delta = change.delta or 0.0

    def shown(value: float | None, *, signed: bool = False) -> str:
        if change.per_batch:
            return f"{format_size(value, signed=signed)}/batch"
        return format_mib(value, signed=signed)

    text = shown(delta, signed=True)
    percent = change.percent
    if percent is not None:
        text += f" ({percent:+.1f}%)"
    mark = "REGRESSION" if change.regression else ("improved" if change.improvement else "")
    return (change.item, change.metric, shown(change.base), shown(change.new), text, mark)

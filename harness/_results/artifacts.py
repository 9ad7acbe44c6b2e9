"""A run's files: ``<name>.json`` (verdict and run metadata), ``<name>.md`` (the report), the
directory's ``index.md``, and the comparison of two saved runs.

The JSON document is ``Verdict.to_dict()`` plus the run's metadata (its ``run_id`` among
them, which ties it to its timeline) and its named checkpoints' readings (see
``reports/README.md`` for the schema). Every file here is written atomically
(:func:`harness._core.fsio.write_atomic`), and every document read is checked against the verdict's
one schema (:mod:`harness._verdict.schema`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness._core.errors import BadInput, one_line
from harness._core.fsio import make_folders, write_atomic
from harness._core.json_values import finite_number, read_json
from harness._core.naming import is_rebuilt
from harness._core.records import HolderRecord
from harness._report.index import GateDecision, index_lines
from harness._report.run import Run, checkpoint_name, ended, epochs, unbatched
from harness._report.sections import render_report
from harness._report.terminal import worst_growth
from harness._verdict.model import Status, Verdict
from harness._verdict.schema import check_verdict

if TYPE_CHECKING:
    from harness._recorder import Recorder

INDEX = "index.md"
DEFAULT_TOLERANCE = 0.10
DEFAULT_MIN_BYTES = 2**20


def save_run(
    directory: str | os.PathLike[str],
    name: str,
    recorder: Recorder,
    verdict: Verdict,
    *,
    title: str | None = None,
    holders: Sequence[HolderRecord] = (),
) -> dict[str, Path]:
    """Write ``<directory>/<name>.json`` and ``<name>.md`` for a recorded run; return the paths
    by kind (``json``, ``md``, and ``timeline`` when ``<name>.jsonl`` exists there).

    ``recorder`` (open or closed) gives the header and samples; its timeline is expected at
    ``<directory>/<name>.jsonl``. ``holders`` is the attribution of held memory (dicts with
    ``path``, ``container``, ``items``, ``bytes``, ``phase``, ``sites``). Raises ``BadInput``
    for a name that is not a plain file name.
    """
    if not name or name in (".", "..") or "/" in name or os.sep in name:
        raise BadInput(f"name must be a plain file name, got {name!r}", field="save_run")
    directory = Path(directory)
    make_folders(directory)
    paths = {"json": directory / f"{name}.json", "md": directory / f"{name}.md"}
    timeline = directory / f"{name}.jsonl"
    if timeline.exists():
        paths["timeline"] = timeline
    run = Run(
        name=name,
        header=dict(recorder.header),
        samples=list(recorder.samples),
        verdict=verdict,
        title=title,
        holders=list(holders),
        timeline=timeline.name if timeline.exists() else None,
        verdict_file=paths["json"].name,
    )
    write_run(run, paths["md"], paths["json"])
    return paths


def write_run(run: Run, markdown: Path | None, document: Path | None) -> None:
    """Write the report to ``markdown`` and the JSON document to ``document`` (either may be
    None), each atomically (:func:`harness._core.fsio.write_atomic`); the JSON goes first, so a
    report never points at a verdict not yet written. Raises ``OSError`` naming the file that
    could not be written; a file not written keeps its previous content."""
    if document is not None:
        text = json.dumps(run_document(run, report=markdown), indent=2, default=str)
        write_atomic(document, text + "\n")
    if markdown is not None:
        write_atomic(markdown, render_report(run))


def run_document(run: Run, *, report: Path | None = None) -> dict[str, Any]:
    """The JSON document of a run: the verdict's dict, then the run's metadata."""
    done, planned = epochs(run)
    times = run.times()
    times = times[times != 0]
    metric = run.metric
    test = run.meta.get("test")
    return {
        **run.verdict.to_dict(),
        "name": run.name,
        "run_id": run.header.get("run_id"),
        "title": run.title,
        "test": test if isinstance(test, str) else None,
        "timeline": run.timeline,
        "report": report.name if report is not None else None,
        "run": {
            "epochs_completed": done,
            "epochs_planned": planned,
            "samples": len(run.samples),
            "torn": run.torn,
            "ended": ended(run),
            "duration_s": round(float(times.max() - times.min()), 3) if len(times) else None,
        },
        "metric": metric,
        "worst_growth": worst_growth(run.verdict),
        "checkpoints": [
            {
                "name": checkpoint_name(s),
                "label": s.label,
                "phase": s.phase,
                "epoch": s.epoch,
                "collected": s.collected,
                "metrics": dict(s.metrics),
            }
            for s in map(run.samples.__getitem__, unbatched(run))
        ],
        "attribution": list(run.holders),
        "header": dict(run.header),
    }


def load_run_document(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a saved verdict; :class:`~harness._core.errors.BadInput` (naming the file and the field)
    when it is missing, not JSON, nested more than 64 levels deep, not a verdict of a readable
    schema, or a field of it is not of its kind (:func:`harness._verdict.schema.check_verdict`)."""
    data = read_json(path)
    if not isinstance(data, dict) or "schema_version" not in data:
        raise BadInput("not a leakgate verdict (no schema_version)", path=path)
    try:
        check_verdict(data)
        Verdict.from_dict(data)
    except KeyError as exc:
        raise BadInput(f"not a leakgate verdict (no {exc})", path=path) from None
    except (ValueError, TypeError, ArithmeticError) as exc:
        raise _in_file(exc, path) from None
    return data


def _in_file(exc: Exception, path: str | os.PathLike[str]) -> BadInput:
    """``exc`` as bad input in the file ``path``, keeping the field it names when it has one."""
    if isinstance(exc, BadInput):
        return BadInput(exc.problem, path=path, line=exc.line, field=exc.field)
    return BadInput(one_line(exc), path=path)


def verdict_files(directory: Path) -> list[Path]:
    """The runs' own verdicts in ``directory``: its ``*.json`` files, rebuilt copies
    (``<name>.rebuilt.json``, :func:`~harness._core.naming.rebuilt`) left out, sorted."""
    return [path for path in sorted(directory.glob("*.json")) if not is_rebuilt(path)]


def write_index(
    directory: str | os.PathLike[str],
    *,
    since: float | None = None,
    decision: GateDecision | None = None,
) -> Path:
    """(Re)write ``<directory>/index.md`` from the verdict JSONs there: the gate's ``decision``
    (when a gate decided) and totals on top, then one row per run, failures first. ``since``
    keeps only runs whose timeline header started at or after that time (a session's own
    runs)."""
    directory = Path(directory)
    make_folders(directory)
    entries = []
    unreadable = 0
    for path in verdict_files(directory):
        try:
            doc = load_run_document(path)
        except ValueError:
            unreadable += 1
            continue
        started = _mapping(doc.get("header")).get("started")
        if since is not None and not ((at := finite_number(started)) is not None and at >= since):
            continue
        entries.append((path, doc))
    index = directory / INDEX
    write_atomic(index, "\n".join(index_lines(entries, unreadable, decision)) + "\n")
    return index


# -- compare ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """One value compared between a base and a new run (``None`` where absent): bytes, or bytes
    per batch for a slope (``per_batch``). ``floor`` is the change always allowed for it (the
    noise floor: ``min_bytes``, or for a slope ``min_bytes`` spread over the phase's judged
    batches)."""

    item: str
    metric: str
    base: float | None
    new: float | None
    regression: bool = False
    improvement: bool = False
    floor: float = 0.0
    per_batch: bool = False

    @property
    def delta(self) -> float | None:
        """``new - base`` when both are present."""
        return None if self.base is None or self.new is None else self.new - self.base

    @property
    def percent(self) -> float | None:
        """The change in percent of the base, only where the base is at least the noise floor
        (a change on a near-zero base reads as an absurd percentage)."""
        delta = self.delta
        if (
            delta is None
            or self.base is None
            or not (self.floor > 0 and abs(self.base) >= self.floor)
        ):
            return None
        return 100 * delta / abs(self.base)


@dataclass(frozen=True)
class Comparison:
    """The outcome of :func:`compare_runs`."""

    changes: tuple[Change, ...]
    base_status: str
    new_status: str
    tolerance: float
    min_bytes: int
    only_in_base: int = 0
    only_in_new: int = 0

    @property
    def status_regressed(self) -> bool:
        """The base passed and the new run did not."""
        return self.base_status == Status.PASS and self.new_status != Status.PASS

    @property
    def nothing_compared(self) -> bool:
        """The two runs had no judged value in common: the comparison proves nothing."""
        return not self.changes

    @property
    def regressions(self) -> list[Change]:
        """The values that grew beyond the tolerance, largest growth first."""
        return sorted((c for c in self.changes if c.regression), key=lambda c: -(c.delta or 0))

    @property
    def regressed(self) -> bool:
        """Whether the gate should fail: a value grew beyond tolerance, the status did, or
        nothing could be compared."""
        return self.status_regressed or bool(self.regressions) or self.nothing_compared


def compare_runs(
    base: Mapping[str, Any],
    new: Mapping[str, Any],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    min_bytes: int = DEFAULT_MIN_BYTES,
) -> Comparison:
    """Compare what the rules judged in two saved runs.

    Compared, for each judged phase in both (matched by phase and epoch, when both used the
    same metric): its ``growth`` and its ``slope`` (bytes per batch); for each phase, its
    highest ``peak_rise`` over its epochs (when both used the same metrics); and the teardown
    residue (the ``teardown`` check's measured bytes, when both judged the same metric). A
    value regresses when it grew by more than ``tolerance`` of the base's magnitude *and* by
    more than its noise floor (``min_bytes``; for a slope, ``min_bytes`` over the phase's
    judged batches), so noise on small numbers is not a regression. Checkpoint readings are
    not compared: their levels depend on what ran before (test order, other fixtures).
    """
    if not (tolerance >= 0 and math.isfinite(tolerance)):
        raise BadInput(f"must be a finite fraction >= 0, got {tolerance!r}", field="tolerance")
    if min_bytes < 0:
        raise BadInput(f"must be >= 0, got {min_bytes!r}", field="min_bytes")
    found: list[tuple[str, str, float, float, float, bool]] = []
    base_phases, new_phases = _phases(base), _phases(new)
    for key, stats in base_phases.items():
        other = new_phases.get(key)
        if other is None or stats.get("metric") != other.get("metric"):
            continue
        scope = str(key[0]) if key[1] is None else f"{key[0]} epoch {key[1]}"
        metric = str(stats.get("metric"))
        judged = finite_number(stats.get("judged")) or 0.0
        values = [
            ("growth", "growth", metric, float(min_bytes), False),
            ("slope", "slope", metric, min_bytes / max(judged, 1.0), True),
        ]
        for field, title, used, floor, per_batch in values:
            a, b = finite_number(stats.get(field)), finite_number(other.get(field))
            if a is not None and b is not None:
                found.append((f"{scope} {title}", used, a, b, floor, per_batch))
    new_peaks = _highest_peaks(new_phases)
    for phase, (a, metrics) in _highest_peaks(base_phases).items():
        b, other_metrics = new_peaks.get(phase, (None, None))
        if b is not None and other_metrics == metrics:
            name = "(no phase)" if phase is None else str(phase)
            found.append((f"{name} peak rise", metrics[0], a, b, float(min_bytes), False))
    base_residue, new_residue = _teardown(base), _teardown(new)
    metric = _rules_metric(base)
    if metric == _rules_metric(new):
        for scope, a in base_residue.items():
            b = new_residue.get(scope)
            if b is not None:
                found.append((f"{scope} teardown residue", metric, a, b, float(min_bytes), False))
    changes = []
    for item, used, a, b, floor, per_batch in found:
        allowed = max(tolerance * abs(a), floor)
        changes.append(Change(item, used, a, b, b - a > allowed, a - b > allowed, floor, per_batch))
    base_keys = set(base_phases) | {("teardown", s) for s in base_residue}
    new_keys = set(new_phases) | {("teardown", s) for s in new_residue}
    return Comparison(
        tuple(changes),
        str(base.get("status")),
        str(new.get("status")),
        tolerance,
        min_bytes,
        len(base_keys - new_keys),
        len(new_keys - base_keys),
    )


def _phases(doc: Mapping[str, Any]) -> dict[tuple[Any, Any], Mapping[str, Any]]:
    """Judged phases by (phase, epoch); ones whose keys are not a name and a number are left
    out."""
    phases = doc.get("phases")
    return {
        (p.get("phase"), p.get("epoch")): p
        for p in (phases if isinstance(phases, list) else ())
        if isinstance(p, Mapping)
        and isinstance(p.get("phase"), (str, type(None)))
        and isinstance(p.get("epoch"), (int, type(None)))
    }


def _highest_peaks(
    phases: Mapping[tuple[Any, Any], Mapping[str, Any]],
) -> dict[Any, tuple[float, tuple[str, str]]]:
    """Each phase's highest ``peak_rise`` over its epochs, with the metrics it is in (the
    peak's, the phase's); phases whose epochs differ in those are left out. Compared per
    phase, not per epoch: where in the run a peak falls moves between runs."""
    highest: dict[Any, tuple[float, tuple[str, str]]] = {}
    mixed = set()
    for (phase, _), stats in phases.items():
        value = finite_number(stats.get("peak_rise"))
        if value is None:
            continue
        metric = str(stats.get("metric"))
        metrics = (str(stats.get("peak_metric") or metric), metric)
        known = highest.get(phase)
        if known is not None and known[1] != metrics:
            mixed.add(phase)
        if known is None or value > known[0]:
            highest[phase] = (value, metrics)
    return {phase: found for phase, found in highest.items() if phase not in mixed}


def _teardown(doc: Mapping[str, Any]) -> dict[str, float]:
    """The teardown check's measured residue, by scope."""
    checks = doc.get("checks")
    found = {}
    for check in checks if isinstance(checks, list) else ():
        if isinstance(check, Mapping) and check.get("rule") == "teardown":
            residue = finite_number(check.get("measured"))
            if residue is not None:
                found[str(check.get("scope"))] = residue
    return found


def _rules_metric(doc: Mapping[str, Any]) -> str:
    rules = doc.get("rules")
    metric = rules.get("metric") if isinstance(rules, Mapping) else None
    return metric if isinstance(metric, str) and metric else "allocated"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}

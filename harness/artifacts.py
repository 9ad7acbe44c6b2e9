"""A run's files: ``<name>.json`` (verdict and run metadata), ``<name>.md`` (the report), the
directory's ``index.md``, and the comparison of two saved runs.

The JSON document is ``Verdict.to_dict()`` plus the run's metadata and its named checkpoints'
readings (see ``reports/README.md`` for the schema).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.report import Run, checkpoint_name, ended, epochs, index_lines, render_report
from harness.rules import Verdict
from harness.terminal import worst_growth

if TYPE_CHECKING:
    from harness.recorder import Recorder

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
    holders: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Path]:
    """Write ``<directory>/<name>.json`` and ``<name>.md`` for a recorded run; return the paths
    by kind (``json``, ``md``, and ``timeline`` when ``<name>.jsonl`` exists there).

    ``recorder`` (open or closed) gives the header and samples; its timeline is expected at
    ``<directory>/<name>.jsonl``. ``holders`` is the attribution of held memory (dicts with
    ``path``, ``container``, ``items``, ``bytes``, ``phase``, ``sites``). Raises ``ValueError``
    for a name that is not a plain file name.
    """
    if not name or name in (".", "..") or "/" in name or os.sep in name:
        raise ValueError(f"save_run: name must be a plain file name, got {name!r}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
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
    None); the JSON goes first, so a report never points at a verdict not yet written."""
    if document is not None:
        text = json.dumps(run_document(run, report=markdown), indent=2, default=str)
        document.write_text(text + "\n")
    if markdown is not None:
        markdown.write_text(render_report(run))


def run_document(run: Run, *, report: Path | None = None) -> dict[str, Any]:
    """The JSON document of a run: the verdict's dict, then the run's metadata."""
    done, planned = epochs(run)
    times = [t for s in run.samples if (t := _number(s.time))]
    metric = run.metric
    test = run.meta.get("test")
    return {
        **run.verdict.to_dict(),
        "name": run.name,
        "title": run.title,
        "test": test if isinstance(test, str) else None,
        "timeline": run.timeline,
        "report": report.name if report is not None else None,
        "run": {
            "epochs_completed": done,
            "epochs_planned": planned,
            "samples": len(run.samples),
            "torn": run.torn,
            "ended": ended(run.samples),
            "duration_s": round(max(times) - min(times), 3) if times else None,
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
            for s in run.samples
            if s.batch is None
        ],
        "attribution": list(run.holders),
        "header": dict(run.header),
    }


def load_run_document(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a saved verdict; ``ValueError`` (one line, naming the file) when it is missing, not
    JSON, or not a verdict of a readable schema."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        data = json.loads(text)
    except ValueError:
        raise ValueError(f"{path}: not JSON") from None
    if not isinstance(data, dict) or "schema_version" not in data:
        raise ValueError(f"{path}: not a leakgate verdict (no schema_version)")
    try:
        Verdict.from_dict(data)
    except KeyError as exc:
        raise ValueError(f"{path}: not a leakgate verdict (no {exc})") from None
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path}: {_first_line(exc)}") from None
    return data


def write_index(directory: str | os.PathLike[str], *, since: float | None = None) -> Path:
    """(Re)write ``<directory>/index.md`` from the verdict JSONs there: totals on top, then one
    row per run, failures first. ``since`` keeps only runs whose timeline header started at or
    after that time (a session's own runs)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    entries = []
    unreadable = 0
    for path in sorted(directory.glob("*.json")):
        try:
            doc = load_run_document(path)
        except ValueError:
            unreadable += 1
            continue
        started = _mapping(doc.get("header")).get("started")
        if since is not None and not (_number(started) is not None and started >= since):
            continue
        entries.append((path, doc))
    index = directory / INDEX
    index.write_text("\n".join(index_lines(entries, unreadable)) + "\n")
    return index


# -- compare ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """One value compared between a base and a new run, in bytes (``None`` where absent)."""

    item: str
    metric: str
    base: float | None
    new: float | None
    regression: bool = False
    improvement: bool = False

    @property
    def delta(self) -> float | None:
        """``new - base`` when both are present."""
        return None if self.base is None or self.new is None else self.new - self.base


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
        return self.base_status == "PASS" and self.new_status != "PASS"

    @property
    def regressions(self) -> list[Change]:
        """The values that grew beyond the tolerance, largest growth first."""
        return sorted((c for c in self.changes if c.regression), key=lambda c: -(c.delta or 0))

    @property
    def regressed(self) -> bool:
        """Whether the gate should fail: a value grew beyond tolerance, or the status did."""
        return self.status_regressed or bool(self.regressions)


def compare_runs(
    base: Mapping[str, Any],
    new: Mapping[str, Any],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    min_bytes: int = DEFAULT_MIN_BYTES,
) -> Comparison:
    """Compare two saved runs checkpoint by checkpoint and phase by phase.

    Compared: each named checkpoint's reading (matched by label, phase, epoch and occurrence;
    in the base's metric, else ``rss``) and each judged phase's ``growth`` and ``peak_rise``
    (matched by phase and epoch, when both used the same metric). A value regresses when it
    grew by more than ``tolerance`` of the base's magnitude *and* by more than ``min_bytes``,
    so noise on small numbers is not a regression.
    """
    if not (tolerance >= 0 and math.isfinite(tolerance)):
        raise ValueError(f"tolerance must be a finite fraction >= 0, got {tolerance!r}")
    if min_bytes < 0:
        raise ValueError(f"min_bytes must be >= 0, got {min_bytes!r}")
    metric = (base.get("rules") or {}).get("metric") or "allocated"
    pairs: list[tuple[str, str, float | None, float | None]] = []
    base_points, new_points = _checkpoints(base), _checkpoints(new)
    for key, readings in base_points.items():
        if key not in new_points:
            continue
        other = new_points[key]
        chosen = next(
            (
                m
                for m in (metric, "rss")
                if _number(readings.get(m)) is not None and _number(other.get(m)) is not None
            ),
            None,
        )
        if chosen is not None:
            pairs.append((_key_name(key), chosen, readings[chosen], other[chosen]))
    base_phases, new_phases = _phases(base), _phases(new)
    for key, stats in base_phases.items():
        other = new_phases.get(key)
        if other is None or stats.get("metric") != other.get("metric"):
            continue
        for field, title in (("growth", "growth"), ("peak_rise", "peak rise")):
            a, b = _number(stats.get(field)), _number(other.get(field))
            if a is not None and b is not None:
                scope = key[0] if key[1] is None else f"{key[0]} epoch {key[1]}"
                pairs.append((f"{scope} {title}", str(stats.get("metric")), a, b))
    changes = []
    for item, used, a, b in pairs:
        allowed = max(tolerance * abs(a), min_bytes)
        changes.append(Change(item, used, a, b, b - a > allowed, a - b > allowed))
    only_base = len(base_points.keys() - new_points.keys()) + len(
        base_phases.keys() - new_phases.keys()
    )
    only_new = len(new_points.keys() - base_points.keys()) + len(
        new_phases.keys() - base_phases.keys()
    )
    return Comparison(
        tuple(changes),
        str(base.get("status")),
        str(new.get("status")),
        tolerance,
        min_bytes,
        only_base,
        only_new,
    )


def _checkpoints(doc: Mapping[str, Any]) -> dict[tuple[Any, ...], Mapping[str, Any]]:
    """Named checkpoints by (phase, epoch, label, occurrence), to their metrics."""
    found: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    seen: dict[tuple[Any, ...], int] = {}
    points = doc.get("checkpoints")
    for point in points if isinstance(points, list) else ():
        if not isinstance(point, Mapping) or not isinstance(point.get("metrics"), Mapping):
            continue
        base_key = (point.get("phase"), point.get("epoch"), point.get("label"))
        n = seen.get(base_key, 0)
        seen[base_key] = n + 1
        found[(*base_key, n)] = point["metrics"]
    return found


def _phases(doc: Mapping[str, Any]) -> dict[tuple[Any, Any], Mapping[str, Any]]:
    phases = doc.get("phases")
    return {
        (p.get("phase"), p.get("epoch")): p
        for p in (phases if isinstance(phases, list) else ())
        if isinstance(p, Mapping)
    }


def _key_name(key: tuple[Any, ...]) -> str:
    _, epoch, label, n = key
    name = str(label) if epoch is None else f"Epoch {epoch} {label}"
    return name if n == 0 else f"{name} ({n + 1})"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__

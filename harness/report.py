"""The markdown report: what failed, where, by how much, and what to do.

Its sections follow the verification report a team wrote by hand for the TFT incident: title,
Executive Summary, Configuration, Memory Profile (one line per named checkpoint), a chart,
Issues Found, Memory Analysis per phase, Test Results Summary, Final Verdict and Logs.
:func:`render_report` never raises on what a timeline may hold: missing header keys, an empty
or partial timeline, findings without evidence all render as ``n/a`` or a sentence saying so.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from harness.chart import MAX_POINTS, memory_chart, shows_capacity
from harness.rules import Finding, PhaseStats, Verdict
from harness.sample import Sample
from harness.units import format_mb, format_size

FALLBACK_METRIC = "rss"
START_LABELS = ("SESSION_START", "session START", "TEST_START")
END_LABELS = ("SESSION_END", "session END", "TEST_END")
PROFILE_BATCH_ROWS = 6
"""About how many rows a run of per-batch checkpoints gets in the Memory Profile (first, every
Nth, highest, last)."""
HIGHEST_MARGIN = 2**20 // 10
"""How far a loop's highest reading must rise above its first and last to get its own row."""
HOLDER_KINDS = ("leak", "peak", "teardown", "oom")
ROOT_CAUSE_ORDER = ("leak", "peak", "teardown", "check", "drift", "oom", "fragmentation")
"""Which finding the Executive Summary names as the root cause: causes before symptoms (a leak
or a peak explains an OOM)."""
_KIND_TITLE = {
    "leak": "Leak",
    "peak": "Peak",
    "drift": "Drift",
    "teardown": "Memory kept after teardown",
    "oom": "Out of memory",
    "check": "Trainer check failed",
    "fragmentation": "Fragmentation",
}
_NOTE_CHARS = 120


@dataclass(frozen=True)
class Run:
    """Everything a report is built from.

    ``header`` is the timeline header (``config``, ``meta``, device, capacity, versions);
    ``holders`` the attribution of held memory (dicts with ``path``, ``container``, ``items``,
    ``bytes``, ``phase``, ``sites``, any of them missing); ``torn`` the torn lines skipped when
    the timeline was read back; ``timeline`` and ``verdict_file`` the paths of those files
    relative to the report, for its Logs section.
    """

    name: str
    header: Mapping[str, Any]
    samples: Sequence[Sample]
    verdict: Verdict
    title: str | None = None
    holders: Sequence[Mapping[str, Any]] = ()
    torn: int = 0
    timeline: str | None = None
    verdict_file: str | None = None

    @property
    def config(self) -> Mapping[str, Any]:
        """The header's ``config`` (the run's settings), empty when absent."""
        return _mapping(self.header.get("config"))

    @property
    def meta(self) -> Mapping[str, Any]:
        """The header's ``meta`` (anything else about the run), empty when absent."""
        return _mapping(self.header.get("meta"))

    @property
    def capacity(self) -> int | None:
        """The device's bytes (emulated or real) from the header, if known."""
        return _int(self.header.get("capacity"))

    @cached_property
    def metric(self) -> str:
        """The metric the profile and chart show: the rules' metric where samples have it,
        else ``rss``, else the probe's primary metric."""
        for m in (self.verdict.rules.metric, FALLBACK_METRIC):
            if any(s.get(m) is not None for s in self.samples):
                return m
        primary = self.header.get("primary")
        return primary if isinstance(primary, str) and primary else self.verdict.rules.metric

    @cached_property
    def capacity_metric(self) -> str:
        """The metric that fills the device: ``reserved`` on CUDA, ``rss`` on CPU (what an
        emulated capacity counts), where samples have it; else :attr:`metric`."""
        probe = self.header.get("probe")
        metric = "reserved" if isinstance(probe, str) and probe.startswith("cuda") else "rss"
        if any(s.get(metric) is not None for s in self.samples):
            return metric
        return self.metric

    def reading(self, sample: Sample) -> int | None:
        """``sample``'s bytes in :attr:`metric`."""
        return _int(sample.get(self.metric))


def epochs(run: Run) -> tuple[int, int | None]:
    """Epochs completed (distinct epochs with an ``EPOCH_END``) and planned (``config.epochs``)."""
    done = {s.epoch for s in run.samples if s.label == "EPOCH_END"}
    return len(done), _int(run.config.get("epochs"))


def ended(samples: Sequence[Sample]) -> bool | None:
    """Whether the run reached its end checkpoint; ``None`` when it has no start one either."""
    labels = {s.label for s in samples}
    if labels & set(END_LABELS):
        return True
    return False if labels & set(START_LABELS) else None


def oom_positions(run: Run) -> set[int]:
    """Positions of the samples where the run ran out of memory: the OOM findings' evidence
    (when it points at this timeline), and samples labelled ``OOM``."""
    positions = {i for i, s in enumerate(run.samples) if s.label.upper() == "OOM"}
    for finding in run.verdict.of_kind("oom"):
        for e in finding.evidence:
            if 0 <= e.index < len(run.samples) and run.samples[e.index].label == e.label:
                positions.add(e.index)
    return positions


def checkpoint_name(sample: Sample) -> str:
    """``Epoch 0 VALIDATION_BATCH #12``, ``SESSION_START``; an OOM event names its phase."""
    if sample.label.upper() == "OOM" and sample.phase:
        phase = sample.phase
        text = str(phase) if sample.batch is None else f"{phase} batch {sample.batch}"
    else:
        text = sample.label if sample.batch is None else f"{sample.label} #{sample.batch}"
    return text if sample.epoch is None else f"Epoch {sample.epoch} {text}"


def render_report(run: Run) -> str:
    """The report as markdown text."""
    sections = [
        _title(run),
        _summary(run),
        _configuration(run),
        _profile(run),
        _chart(run),
        _issues(run),
        _analysis(run),
        _results(run),
        _final(run),
        _logs(run),
    ]
    return "\n\n".join("\n".join(lines) for lines in sections if lines) + "\n"


# -- sections -------------------------------------------------------------------------------------


def _title(run: Run) -> list[str]:
    name = _line(run.title or run.name) or "unnamed run"
    return [
        f"# Memory report: {name}",
        "",
        f"{_date(run.header.get('started'))} · {_device(run.header)} · "
        f"verdict **{run.verdict.status}**",
    ]


def _summary(run: Run) -> list[str]:
    lines = [
        "## Executive Summary",
        "",
        f"- **Environment:** {_environment(run.header)}",
        f"- **Run:** {_run_line(run)}",
        f"- **Verdict:** {_verdict_line(run.verdict)}",
    ]
    cause = _root_cause(run)
    if cause:
        lines.append(f"- **Root cause:** {cause}")
    return lines


def _configuration(run: Run) -> list[str]:
    config, meta = run.config, run.meta
    capacity = run.capacity
    if capacity is None:
        capacity_text = "n/a"
    elif run.header.get("capacity_emulated"):
        real = _int(run.header.get("total_memory"))
        capacity_text = f"{format_mb(capacity)} (emulated; device {format_mb(real)})"
    else:
        capacity_text = f"{format_mb(capacity)} (real)"
    rows = [
        ("Device", _device(run.header)),
        ("Capacity", capacity_text),
        ("Batch size", _value(config.get("batch_size"))),
        ("Validation batch size", _value(config.get("validation_batch_size"))),
        ("Epochs", _value(config.get("epochs"))),
        ("Training samples", _value(meta.get("train_samples"))),
        ("Validation samples", _value(meta.get("val_samples"))),
        (
            "Probe / metric",
            f"{_value(run.header.get('probe'))} / {run.metric}"
            f" (primary: {_value(run.header.get('primary'))})",
        ),
        ("Rules", _rules_text(run.verdict)),
    ]
    if "faults" in meta:
        rows.append(("Faults", _value(meta.get("faults"))))
    if "test" in meta:
        rows.append(("Test", _code(_value(meta.get("test")))))
    shown_config = {"batch_size", "validation_batch_size", "epochs"}
    shown_meta = {"train_samples", "val_samples", "faults", "test", "rules"}
    other = [f"{k}={_value(v)}" for k, v in config.items() if k not in shown_config]
    other += [f"{k}={_value(v)}" for k, v in meta.items() if k not in shown_meta]
    if other:
        rows.append(("Other settings", ", ".join(other)))
    notes = run.header.get("notes")
    if isinstance(notes, list) and notes:
        rows.append(("Probe notes", "; ".join(_line(str(n)) for n in notes)))
    return ["## Configuration", "", *_table(("Setting", "Value"), rows)]


def _profile(run: Run) -> list[str]:
    lines = ["## Memory Profile", ""]
    if not run.samples:
        return [*lines, "No checkpoint was recorded."]
    metric, against = run.metric, run.capacity_metric
    capacity = run.capacity
    rows = _profile_rows(run)
    width = max(len(name) for name, _, _ in rows) + 1
    right = f"{against} / capacity" if capacity else against
    header = [f"{'checkpoint':<{width}}", f"{metric:>10}"]
    if against != metric:
        header.append(right)
    elif capacity:
        header[-1] += " / capacity"
    body = ["  ".join(header)]
    for name, i, notes in rows:
        sample = run.samples[i]
        cells = [f"{name + ':':<{width}}", f"{format_mb(run.reading(sample)):>10}"]
        used = _int(sample.get(against))
        if against != metric:
            cells.append(format_mb(used))
        if used is not None and capacity:
            cells[-1] += f" / {format_mb(capacity)} ({100 * used / capacity:.1f}% utilization)"
        if notes:
            cells[-1] += f"  ({'; '.join(notes)})"
        body.append("  ".join(cells).rstrip())
    explained = "; per-batch checkpoints: first, every Nth, highest and last of each loop"
    capacity_text = (
        f"; utilization is `{against}` against the capacity ({format_mb(capacity)})"
        if capacity
        else ""
    )
    lines.append(
        f"`{metric}` at each named checkpoint"
        + (explained if _batch_runs(run) else "")
        + capacity_text
        + f". {len(run.samples)} checkpoints in all."
    )
    return [*lines, "", *_fenced("text", body)]


def _chart(run: Run) -> list[str]:
    series = {run.metric: [run.reading(s) for s in run.samples]}
    against = run.capacity_metric
    if against != run.metric:
        filling = [_int(s.get(against)) for s in run.samples]
        if shows_capacity({against: filling}, run.capacity):
            series[against] = filling
    names = list(series)
    block = memory_chart(series, capacity=run.capacity)
    if not block:
        return []
    drawn = [f"`{m}`" for m in names if any(v is not None for v in series[m])]
    if shows_capacity(series, run.capacity):
        drawn.append(f"the capacity ({format_mb(run.capacity)}, flat)")
    lines_text = f"lines, in order: {', '.join(drawn)}" if len(drawn) > 1 else drawn[0]
    caption = f"MB per checkpoint ({lines_text}); x is the checkpoint number"
    if len(run.samples) > MAX_POINTS:
        caption += f"; the run is drawn as {MAX_POINTS} spans at each span's highest reading"
    ooms = sorted(oom_positions(run))
    if ooms:
        caption += "; out of memory at " + ", ".join(
            f"#{i} ({checkpoint_name(run.samples[i])})" for i in ooms[:3]
        )
    lines = ["## Memory Over the Run", "", *block, "", caption + "."]
    guide = _phase_guide(run)
    if guide:
        lines += ["", f"Checkpoints by phase: {guide}."]
    return lines


def _issues(run: Run) -> list[str]:
    lines = ["## Issues Found", ""]
    verdict = run.verdict
    if verdict.error:
        lines += [f"The run raised `{_line(verdict.error)}`; its timeline was judged up to there."]
        lines.append("")
    if not verdict.findings:
        return [*lines, "None: no rule was broken."]
    for n, finding in enumerate(_ranked(verdict.findings), start=1):
        holders = _holders_for(run, finding)
        lines += [
            f"### Issue {n} ({finding.severity}): "
            f"{_KIND_TITLE.get(finding.kind, finding.kind.capitalize())} in "
            f"{_scope(finding.phase, finding.epoch)}",
            "",
            f"- **Evidence:** {_evidence(run, finding)}",
            f"- **Suspected root cause:** {_cause(finding, holders, verdict.findings)}",
            f"- **Recommended fix:** {_fix(finding, holders, verdict.findings)}",
            "",
        ]
    return lines[:-1]


def _analysis(run: Run) -> list[str]:
    header = ("Phase", "Batches", "Start", "End", "Growth", "Peak", "Slope", "Budget", "Status")
    rows = _analysis_rows(run)
    lines = ["## Memory Analysis", ""]
    if not rows:
        return [*lines, "No phase has per-batch checkpoints to analyse."]
    lines += [
        "Per phase and epoch, in the phase's metric: batches judged (after the warm-up of "
        f"{run.verdict.rules.warmup}) of those recorded; start and end readings; growth and "
        "slope after the warm-up (robust: Theil-Sen slope, medians of the ends); peak is the "
        "highest reading's rise above the start (the high-water mark where the probe has one); "
        "budget is `max_growth`. Phases outside the rules' `phase` are shown unjudged.",
        "",
        *_table(header, rows),
    ]
    return lines


def _results(run: Run) -> list[str]:
    lines = ["## Test Results Summary", ""]
    checks = run.verdict.checks
    if not checks:
        return [*lines, "No rule was checked."]
    rows = [(c.rule, c.scope, _status(c.status), c.details) for c in checks]
    return [*lines, *_table(("Rule", "Scope", "Status", "Details"), rows)]


def _final(run: Run) -> list[str]:
    verdict = run.verdict
    ran = [c for c in verdict.checks if c.status != "SKIP"]
    passing = [c for c in ran if c.status in ("PASS", "WARN")]
    share = 100 * len(passing) / len(ran) if ran else 0.0
    completion = f"Completion: {len(passing)}/{len(ran)} checks passing ({share:.0f}%)"
    skipped = len(verdict.checks) - len(ran)
    warned = sum(c.status == "WARN" for c in ran)
    extras = [f"{skipped} skipped"] * bool(skipped) + [f"{warned} with a warning"] * bool(warned)
    if extras:
        completion += f", {', '.join(extras)}"
    lines = [
        "## Final Verdict",
        "",
        f"**ALL CHECKS PASSING: {'YES' if verdict.passed else 'NO'}** (verdict {verdict.status})",
        "",
        completion + ".",
    ]
    remaining = [f for f in _ranked(verdict.findings) if f.blocking]
    if remaining:
        listed = "; ".join(f"{f.severity} {_line(f.message)}" for f in remaining)
        lines += ["", f"Remaining: {listed}"]
    if run.torn or ended(run.samples) is False:
        lines += ["", "Judged on an incomplete timeline: the run did not reach its end."]
    return lines


def _logs(run: Run) -> list[str]:
    count = f"{len(run.samples)} checkpoints"
    if run.torn:
        count += f"; {run.torn} torn last line skipped: the writer was killed mid-line"
    timeline = f"[{run.timeline}]({_link(run.timeline)})" if run.timeline else "not written"
    verdict = (
        f"[{run.verdict_file}]({_link(run.verdict_file)})" if run.verdict_file else ("not written")
    )
    return [
        "## Logs",
        "",
        f"- Timeline (JSONL): {timeline} ({count})",
        f"- Verdict (JSON): {verdict}",
    ]


# -- pieces ---------------------------------------------------------------------------------------


def _environment(header: Mapping[str, Any]) -> str:
    parts = [_device(header)]
    for key, name in (("torch", "torch"), ("python", "Python"), ("leakgate", "leakgate")):
        if header.get(key):
            parts.append(f"{name} {_value(header[key])}")
    if header.get("driver"):
        parts.append(f"driver {_value(header['driver'])}")
    if header.get("host"):
        parts.append(f"host {_value(header['host'])}")
    commit = header.get("git_commit")
    if isinstance(commit, str) and commit:
        parts.append(f"commit {commit[:10]}")
    return " · ".join(parts)


def _run_line(run: Run) -> str:
    done, planned = epochs(run)
    if planned is not None:
        text = f"{done} of {planned} epochs completed"
    elif done:
        text = f"{done} epochs completed (planned: n/a)"
    else:
        text = "epochs: n/a"
    text += f" · {len(run.samples)} checkpoints"
    times = [s.time for s in run.samples if isinstance(s.time, (int, float)) and s.time > 0]
    if len(times) > 1:
        text += f" over {max(times) - min(times):.1f} s"
    finished = ended(run.samples)
    if finished is False and run.samples:
        text += f" · stopped at {checkpoint_name(run.samples[-1])}, before the end of the run"
    elif finished is None and planned is not None and done < planned and run.samples:
        text += f" · stopped at {checkpoint_name(run.samples[-1])}"
    if run.torn:
        text += " · timeline cut short (torn last line skipped)"
    return text


def _verdict_line(verdict: Verdict) -> str:
    if verdict.status == "ERROR":
        return f"ERROR: the run raised `{_line(verdict.error or 'an error')}`"
    counts: dict[str, int] = {}
    for f in verdict.findings:
        counts[f.severity] = counts.get(f.severity, 0) + 1
    found = ", ".join(f"{n} {sev}" for sev, n in sorted(counts.items()))
    ran = sum(c.status != "SKIP" for c in verdict.checks)
    if verdict.status == "PASS":
        text = f"PASS: every rule checked held ({ran} checks)"
        return text + (f"; warnings: {found}" if found else "")
    return f"{verdict.status}: {found or 'no'} finding(s) in {ran} checks"


def _root_cause(run: Run) -> str | None:
    verdict = run.verdict
    blocking = [f for f in verdict.findings if f.blocking]
    if verdict.passed or not blocking:
        return None
    first = min(blocking, key=lambda f: (_order(f.kind), -(_int(f.bytes) or 0)))
    text = _line(first.message)
    holders = _holders_for(run, first)
    if holders:
        text += f"; {_holder_text(holders[0])}"
    return text + ("" if text.endswith(".") else ".")


def _ranked(findings: Sequence[Finding]) -> list[Finding]:
    """Findings, causes before their symptoms (see :data:`ROOT_CAUSE_ORDER`)."""
    return sorted(findings, key=_rank)


def _order(kind: str) -> int:
    return ROOT_CAUSE_ORDER.index(kind) if kind in ROOT_CAUSE_ORDER else len(ROOT_CAUSE_ORDER)


def _rank(finding: Finding) -> tuple[str, int]:
    """Issues in order of severity, then cause before symptom."""
    return finding.severity, _order(finding.kind)


def _profile_rows(run: Run) -> list[tuple[str, int, list[str]]]:
    """(name, position, notes) for each row of the Memory Profile."""
    ooms = oom_positions(run)
    keep: dict[int, list[str]] = {}
    for positions in _batch_runs(run):
        values = [run.reading(run.samples[i]) for i in positions]
        step = _nice_step(math.ceil(len(positions) / PROFILE_BATCH_ROWS))
        chosen = {0, len(positions) - 1, *range(0, len(positions), step)}
        measured = [k for k, v in enumerate(values) if v is not None]
        if measured:
            high = max(measured, key=lambda k: values[k])
            ends = max(values[measured[0]], values[measured[-1]])
            if values[high] >= ends + HIGHEST_MARGIN:
                chosen.add(high)
                keep[positions[high]] = ["highest of the loop"]
        for k in chosen:
            keep.setdefault(positions[k], [])
    rows = []
    for i, s in enumerate(run.samples):
        if i not in keep and not (s.batch is None or i in ooms or s.note):
            continue
        notes = list(keep.get(i, []))
        if s.collected:
            notes.append("after gc")
        if s.note:
            notes.append(_line(s.note)[:_NOTE_CHARS])
        name = checkpoint_name(s)
        rows.append((f"[OOM ERROR] {name}" if i in ooms else name, i, notes))
    return rows


def _batch_runs(run: Run) -> list[list[int]]:
    """Positions of each run of consecutive per-batch samples of one label, phase and epoch."""
    runs: list[list[int]] = []
    key = None
    for i, s in enumerate(run.samples):
        if s.batch is None or s.label.upper() == "OOM":
            key = None
            continue
        this = (s.label, s.phase, s.epoch)
        if this != key:
            runs.append([])
            key = this
        runs[-1].append(i)
    return runs


def _nice_step(at_least: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 25, 50, 100, ... that is at least ``at_least``."""
    scale = 1
    while True:
        for base in (1, 2, 5, 10, 20, 25, 50):
            if base * scale >= at_least:
                return base * scale
        scale *= 100


def _phase_guide(run: Run) -> str:
    """``training e0 #1-21 · validation e0 #22-34 · ...``: where each phase lies on the x axis."""
    spans: list[list[Any]] = []
    for i, s in enumerate(run.samples):
        if s.batch is None or s.label.upper() == "OOM":
            continue
        key = (s.phase, s.epoch)
        if spans and spans[-1][0] == key:
            spans[-1][2] = i
        else:
            spans.append([key, i, i])
    parts = []
    for (phase, epoch), first, last in spans[:12]:
        name = _line(str(phase)) if phase is not None else "batches"
        parts.append(f"{name}{'' if epoch is None else f' e{epoch}'} #{first}-{last}")
    if len(spans) > 12:
        parts.append(f"... {len(spans) - 12} more")
    return " · ".join(parts)


def _holders_for(run: Run, finding: Finding) -> list[Mapping[str, Any]]:
    """The holders that may explain ``finding``, biggest first: those of its phase (a teardown's
    is ``session``) and those without a phase; every holder for a finding without a phase."""
    if finding.kind not in HOLDER_KINDS:
        return []
    matching = [
        h
        for h in run.holders
        if isinstance(h, Mapping)
        and (finding.phase is None or h.get("phase") in (None, finding.phase))
    ]
    return sorted(matching, key=lambda h: -(_int(h.get("bytes")) or 0))


def _holder_text(holder: Mapping[str, Any]) -> str:
    """``held by Trainer._attn_cache (list, 176 items, 2.3MB), allocated at tft/faults.py:42``"""
    details = []
    if holder.get("container") is not None:
        details.append(_value(holder["container"]))
    items = _int(holder.get("items"))
    if items is not None:
        details.append(f"{items} item{'s' * (items != 1)}")
    size = _int(holder.get("bytes"))
    if size is not None:
        details.append(format_size(size))
    path = holder.get("path")
    text = f"held by `{_line(str(path))}`" if path else "held by an unnamed object"
    if details:
        text += f" ({', '.join(details)})"
    sites = holder.get("sites")
    if isinstance(sites, (list, tuple)) and sites:
        text += ", allocated at " + ", ".join(f"`{_line(str(s))}`" for s in sites[:3])
    return text


def _evidence(run: Run, finding: Finding) -> str:
    text = _line(finding.message)
    readings = []
    for e in finding.evidence:
        value = _int(e.value)
        where = checkpoint_name(Sample(e.label, e.phase, e.epoch, e.batch))
        readings.append(f"{where} = {format_mb(value)} ({e.metric or 'n/a'})")
    if readings:
        text += ". Readings: " + "; ".join(readings)
    if finding.slope is not None:
        text += f". Slope {_rate(finding.slope)}"
    return text + "."


def _cause(
    finding: Finding, holders: Sequence[Mapping[str, Any]], findings: Sequence[Finding]
) -> str:
    if holders:
        text = _holder_text(holders[0])
        if len(holders) > 1:
            text += "; also " + "; ".join(_holder_text(h) for h in holders[1:3])
        return f"Memory {text}."
    phase = _line(finding.phase) if finding.phase else "the run"
    if finding.kind == "leak":
        if "released when the phase ended" in finding.message:
            return (
                f"Memory kept from batch to batch inside the {phase} loop and released only "
                "when the phase ended: a per-batch cache or list (outputs, attention tensors, "
                "losses kept with their graph) cleared after the loop instead of inside it."
            )
        if "retained after collection" in finding.message:
            return (
                f"Memory added by every {phase} batch and still held after the phase and a full "
                "collection: a long-lived reference (an attribute, a global, a cache) keeps it."
            )
        return (
            f"Memory added by every {phase} batch and not released within the loop "
            "(outputs, losses or caches kept across batches)."
        )
    if finding.kind == "peak" and _leak_beside(finding, findings):
        return (
            f"The growth reported as a leak in this phase: the {phase} loop's memory rose batch "
            "by batch to this peak."
        )
    if finding.kind == "peak":
        return (
            f"One {phase} batch needed {format_size(_int(finding.bytes))} above the phase's start: "
            "a bigger batch than the others (check the batch size this phase really uses) or an "
            "unusually large input."
        )
    if finding.kind == "drift":
        return (
            "Memory added once per epoch and never released: state that accumulates across "
            "epochs (a history of tensors, optimizer state, saved checkpoints kept in memory)."
        )
    if finding.kind == "teardown":
        return (
            "A reference that outlives the session keeps memory alive: a second strong reference "
            "to the model, its parameters or the optimizer (a global, a class attribute, a "
            "callback, a closure)."
        )
    if finding.kind == "check":
        return "A trainer invariant did not hold; the evidence above names it."
    if finding.kind == "oom":
        return (
            f"The {phase} step needed more memory than the device has; a leak or peak above "
            "says what filled it, else the step's own footprint (batch size, retained optimizer "
            "state, activations) is too large."
        )
    if finding.kind == "fragmentation":
        return (
            "The caching allocator reserves blocks it cannot reuse (tensor shapes that vary from "
            "batch to batch)."
        )
    return "See the evidence above."


def _leak_beside(finding: Finding, findings: Sequence[Finding]) -> bool:
    """Whether a leak was found in ``finding``'s phase and epoch."""
    return any(
        f.kind == "leak" and (f.phase, f.epoch) == (finding.phase, finding.epoch) for f in findings
    )


def _fix(
    finding: Finding, holders: Sequence[Mapping[str, Any]], findings: Sequence[Finding]
) -> str:
    holder = _line(str(holders[0].get("path"))) if holders and holders[0].get("path") else None
    if finding.kind == "leak":
        target = f"`{holder}`" if holder else "what the loop keeps"
        return (
            f"Clear {target} inside the loop, every batch, not after it; keep only detached "
            "values (`.detach()`, `.item()`) across batches"
            + (
                ", and validate under `torch.inference_mode()`."
                if finding.phase == "validation"
                else "."
            )
        )
    if finding.kind == "peak" and _leak_beside(finding, findings):
        return "Fix the leak in this phase; the peak goes with it."
    if finding.kind == "peak":
        return (
            "Make the phase use the batch size you meant (no hard-coded override in the CLI or "
            "config), or split the large input; set `max_peak` to what one batch may use."
        )
    if finding.kind == "drift":
        return (
            "Release per-epoch state before the next epoch: store metrics as Python numbers, "
            "free or offload optimizer state as intended, drop references to saved checkpoints."
        )
    if finding.kind == "teardown":
        target = f"`{holder}`" if holder else "the extra reference"
        return (
            f"Drop {target} when the session ends (or hold it weakly), so that the model, its "
            "parameters and the optimizer state can be freed."
        )
    if finding.kind == "oom":
        target = f"clear `{holder}` inside the loop" if holder else "fix the leak or peak above"
        return (
            f"First {target}; then lower the step's footprint (batch size, optimizer state "
            "released before validation, no graphs kept) until the phase fits the capacity."
        )
    if finding.kind == "fragmentation":
        return (
            "Keep tensor shapes stable (pad to fixed sizes), or set "
            "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`."
        )
    if finding.kind == "check":
        return "Restore the invariant the check names, then keep the check in the run."
    return "Act on the evidence above."


def _phase_row(p: PhaseStats) -> tuple[str, ...]:
    return (
        _scope(p.phase, p.epoch),
        f"{p.judged}/{p.batches}",
        format_mb(p.start),
        format_mb(p.end),
        format_size(p.growth, signed=True),
        format_size(p.peak_rise, signed=True),
        _rate(p.slope),
        format_size(p.budget) if p.budget is not None else "n/a",
        _status(p.status),
    )


def _analysis_rows(run: Run) -> list[tuple[str, ...]]:
    """One row per phase and epoch with batches, in timeline order: the verdict's statistics
    where the rules judged it, else start, end, change and peak of the readings."""
    judged = {(p.phase, p.epoch): p for p in run.verdict.phases}
    groups: dict[tuple[Any, Any], list[int]] = {}
    for i, s in enumerate(run.samples):
        groups.setdefault((s.phase, s.epoch), []).append(i)
    rows = []
    for key, positions in groups.items():
        if key in judged:
            rows.append(_phase_row(judged.pop(key)))
            continue
        batches = [i for i in positions if run.samples[i].batch is not None]
        values = [v for v in (run.reading(run.samples[i]) for i in positions) if v is not None]
        if not batches or not values:
            continue
        rows.append(
            (
                _scope(*key),
                f"-/{len(batches)}",
                format_mb(values[0]),
                format_mb(values[-1]),
                format_size(values[-1] - values[0], signed=True),
                format_size(max(values) - values[0], signed=True),
                "n/a",
                "n/a",
                "not judged",
            )
        )
    return rows + [_phase_row(p) for p in judged.values()]


def _rules_text(verdict: Verdict) -> str:
    rules = verdict.rules
    parts = [f"phase {', '.join(rules.phase) if rules.phase else 'all'}"]
    for name in ("max_growth", "max_peak", "max_drift", "teardown"):
        value = getattr(rules, name)
        parts.append(f"{name} {format_size(value) if value is not None else 'off'}")
    parts += [f"warmup {rules.warmup}", f"metric {rules.metric}"]
    return " · ".join(parts)


def _device(header: Mapping[str, Any]) -> str:
    probe = header.get("probe")
    device = header.get("device")
    parts = [_line(str(p)) for p in (probe, device) if p]
    return ": ".join(parts) if parts else "device n/a"


def _date(started: Any) -> str:
    if isinstance(started, bool) or not isinstance(started, (int, float)):
        return "date n/a"
    try:
        when = dt.datetime.fromtimestamp(started, tz=dt.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return "date n/a"
    return when.strftime("%Y-%m-%d %H:%M UTC")


def _scope(phase: Any, epoch: Any) -> str:
    name = _line(str(phase)) if phase is not None else "(no phase)"
    return name if epoch is None else f"{name} epoch {epoch}"


def _rate(slope: float | None) -> str:
    """Bytes per batch, as KB or MB per batch."""
    if slope is None or not math.isfinite(slope):
        return "n/a"
    if abs(slope) >= 2**20:
        return f"{slope / 2**20:+.1f}MB/batch"
    return f"{slope / 2**10:+.1f}KB/batch"


def _status(status: str) -> str:
    return f"**{status}**" if status in ("FAIL", "ERROR") else status


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    def cells(values: Sequence[str]) -> str:
        return "| " + " | ".join(_cell(v) for v in values) + " |"

    return [cells(header), "|" + "|".join("---" for _ in header) + "|", *map(cells, rows)]


def _cell(text: str) -> str:
    return _line(text).replace("|", "\\|") or " "


def _fenced(language: str, body: Sequence[str]) -> list[str]:
    """A fenced block longer than any run of backticks in ``body``."""
    fence = "`" * max(3, _longest_backticks(body) + 1)
    return [f"{fence}{language}", *body, fence]


def _longest_backticks(lines: Sequence[str]) -> int:
    best = 0
    for line in lines:
        count = 0
        for char in line:
            count = count + 1 if char == "`" else 0
            best = max(best, count)
    return best


def _code(text: str) -> str:
    return f"`{text}`" if "`" not in text else text


def _link(path: str) -> str:
    return path.replace(" ", "%20").replace("(", "%28").replace(")", "%29")


def _line(text: str) -> str:
    """One line of text: whitespace runs (newlines included) become single spaces."""
    return " ".join(str(text).split())


def _value(value: Any) -> str:
    """A header value for a person: text as is, others as compact JSON, ``n/a`` for None."""
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return _line(value) or "n/a"
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        text = ", ".join(_line(v) for v in value)
        return text if len(text) <= 80 else text[:77] + "..."
    try:
        text = json.dumps(value, default=str, separators=(",", ":"))
    except (TypeError, ValueError):
        text = str(value)
    text = _line(text)
    return text if len(text) <= 80 else text[:77] + "..."


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _int(value: Any) -> int | None:
    """``value`` as an int when it is a finite number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if math.isfinite(value) else None

"""Rules judged once per run: drift, teardown, failed trainer checks and out-of-memory events.

Drift (P2, ``max_drift``): every non-batch label seen in several epochs, each later epoch's first
reading against the earliest judged epoch's, leaving out the first ``warmup_epochs``. Growth
that a bounded cache accounts for between the two readings (:func:`~harness._rules.saturation.
cached_between`) is not drift: the same growth is read once, as the cache it is (unless
``cache_is_leak``). Teardown
(P0, ``teardown``): the last collected sample at or after the run's end (``SESSION_END``,
``TEST_END``) against the last collected one at or before its start (before the model exists).
Check (P1): samples labelled ``CHECK_FAILED``, one finding per phase. OOM (P0): OOM events, one
finding per failing batch; an error the run raised that is an OOM counts too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import NamedTuple

import numpy as np

import harness._core.labels as labels
from harness._core.units import format_size
from harness._core.wording import plural
from harness._measure.children import CHILDREN_COST, JOB, parse_processes
from harness._measure.sample import Sample
from harness._rules.context import FALLBACK_METRIC, Context, where
from harness._rules.registry import register_rule
from harness._rules.saturation import cached_between
from harness._timeline.store import NONE
from harness._verdict.model import CheckStatus, Finding, Kind


@register_rule("max_drift", option="max_drift")
def drift(ctx: Context, limit: int) -> list[Finding]:
    """``max_drift``: each label read outside a loop in several epochs, its later epochs against
    its first judged one; the finding of the label that drifted most."""
    limit = max(limit, ctx.measure.floor)
    firsts = _epoch_firsts(ctx)
    failures: list[Finding] = []
    compared = False
    for label, by_epoch in firsts.items():
        epochs = sorted(by_epoch)[ctx.rules.warmup_epochs :]
        if len(epochs) < 2:
            continue
        compared = True
        failure = _label_drift(ctx, label, [(e, by_epoch[e]) for e in epochs], limit)
        if failure is not None:
            failures.append(failure)
    if not compared:
        ctx.check("max_drift", "run", CheckStatus.SKIP, _too_few_epochs(ctx, firsts))
    if not failures:
        return []
    worst_finding = max(failures, key=lambda f: f.bytes or 0)
    if len(failures) > 1:
        worst_finding = replace(
            worst_finding, message=f"{worst_finding.message} ({len(failures)} labels drift)"
        )
    return [worst_finding]


class _Drift(NamedTuple):
    """A label's worst drift from its first judged epoch: the growth beyond the bounded caches
    (``residual``), all of it (``amount``), the position it was read at and in which metric,
    and what the caches account for, with their phases' names."""

    residual: float
    amount: float
    at: int
    metric: str
    cached: float
    caches: list[str]


def _epoch_firsts(ctx: Context) -> dict[str, dict[int, int]]:
    """Each label read outside a loop (no OOM or failed check) and its first reading's position
    in each epoch, the labels in the order first read."""
    samples, cols = ctx.samples, ctx.columns
    readings = np.flatnonzero(
        (cols.batch == NONE) & (cols.epoch != NONE) & ~(cols.oom | cols.check_failed)
    )
    pairs = np.stack((cols.label[readings].astype(np.int64), cols.epoch[readings]))
    _, first = np.unique(pairs, axis=1, return_index=True)
    firsts: dict[str, dict[int, int]] = {}
    for i in sorted(readings[first].tolist()):
        firsts.setdefault(samples[i].label, {})[int(cols.epoch[i])] = i
    return firsts


def _label_drift(
    ctx: Context, label: str, readings: list[tuple[int, int]], limit: int
) -> Finding | None:
    """Judge one label's ``readings`` (each judged epoch and its first reading's position, the
    first the reference): its check, and its finding when it fails."""
    (epoch, ref), later = readings[0], [at for _, at in readings[1:]]
    worst = _worst_drift(ctx, ref, later)
    if worst is None:
        ctx.check("max_drift", label, CheckStatus.SKIP, "no comparable readings")
        return None
    details = (
        f"epoch {ctx.samples[worst.at].epoch} vs epoch {epoch}: "
        f"{format_size(worst.amount, signed=True)} ({worst.metric})"
    )
    if worst.cached:
        details += (
            f", {format_size(worst.cached, signed=True)} of it the bounded cache in "
            f"{', '.join(worst.caches)}"
        )
    status = (
        CheckStatus.FAIL
        if worst.residual > limit
        else CheckStatus.WARN
        if worst.amount > limit
        else CheckStatus.PASS
    )
    ctx.check("max_drift", label, status, details, worst.residual, limit)
    return _drift_finding(ctx, label, epoch, ref, worst) if status == CheckStatus.FAIL else None


def _worst_drift(ctx: Context, ref: int, later: list[int]) -> _Drift | None:
    """Of the ``later`` positions comparable with ``ref``, the one grown most beyond the
    bounded caches (growth the confirming series and, for the job, the children confirm)."""
    worst: _Drift | None = None
    for at in later:
        metric = ctx.pair_metric(ref, at)
        if metric is None:
            continue
        grown = ctx.value(at, metric) - ctx.value(ref, metric)
        amount = min([grown, *_confirmed(ctx, ref, at)])
        if not _children_grew(ctx, ref, at, amount):
            continue
        cached, caches = cached_between(ctx, ref, at, metric)
        if worst is None or amount - cached > worst.residual:
            worst = _Drift(amount - cached, amount, at, metric, cached, caches)
    return worst


def _drift_finding(ctx: Context, label: str, epoch: int, ref: int, worst: _Drift) -> Finding:
    """The finding of a label that drifted past ``max_drift`` from ``epoch`` (read at
    ``ref``)."""
    samples, at = ctx.samples, worst.at
    beyond = (
        f" ({format_size(worst.residual, signed=True)} beyond the bounded cache)"
        if worst.cached
        else ""
    )
    message = (
        f"{ctx.measure.drift(label)}: {format_size(worst.amount, signed=True)}{beyond} from "
        f"epoch {epoch} to epoch {samples[at].epoch} > max_drift "
        f"{ctx.rules.shown('max_drift')}{ctx.parts(ref, at)}{processes(ctx, ref, at)}"
    )
    evidence = (ctx.evidence(ref, worst.metric), ctx.evidence(at, worst.metric))
    return Finding(
        Kind.OUTSIDE if ctx.measure.kind == Kind.OUTSIDE else Kind.DRIFT,
        samples[at].phase,
        samples[at].epoch,
        round(worst.residual),
        message,
        None,
        evidence,
        rule="max_drift",
    )


def _confirmed(ctx: Context, ref: int, at: int) -> list[int]:
    """What each series that must confirm the measure's growth (:attr:`~harness._rules.measures.
    Measure.confirms`) grew by between two positions, where it was read at both."""
    grown: list[int] = []
    for series in ctx.measure.confirms:
        if all(ctx.columns.present(m)[[ref, at]].all() for m in series):
            first, *rest = series
            grown.append(
                ctx.value(at, first)
                - ctx.value(ref, first)
                - sum(ctx.value(at, m) - ctx.value(ref, m) for m in rest)
            )
    return grown


def _children_grew(ctx: Context, ref: int, at: int, amount: float) -> bool:
    """For the job's drift, whether what the children add grew by half of it or more (else the
    main process's own drift is the finding, on the rules' metric); True for any other
    measure."""
    if ctx.measure.metric != JOB:
        return True
    before, after = (ctx.samples[i].get(CHILDREN_COST) or 0 for i in (ref, at))
    return after - before >= amount / 2


def processes(ctx: Context, ref: int, at: int) -> str:
    """For the job's drift, the child processes alive at the two positions, and those alive at
    ``at`` by the epoch they started in: ``; 10 processes alive at epoch 4 against 4 at epoch 1
    (2 more each epoch); started in epoch 2 and still alive: python3 4242, python3 4243``."""
    if ctx.measure.metric != JOB:
        return ""
    cols, samples = ctx.columns, ctx.samples
    then, now = (parse_processes(samples[i].processes) for i in (ref, at))
    first, last = (int(cols.epoch[i]) for i in (ref, at))
    alive = plural(len(now), "child process", "child processes")
    if now.keys() == then.keys():
        return f"; the same {alive} alive at epoch {first} and {last}"
    text = f"; {alive} alive at epoch {last} against {len(then)} at epoch {first}"
    if last > first and len(now) > len(then):
        text += f" ({(len(now) - len(then)) / (last - first):g} more each epoch)"
    codes, starts = np.unique(cols.processes[: at + 1], return_index=True)
    born: dict[str, int] = {}
    for code, start in sorted(
        zip(codes.tolist(), starts.tolist(), strict=True), key=lambda c: c[1]
    ):
        for role in parse_processes(cols.strings[code]):
            born.setdefault(role, int(cols.epoch[start]))
    kept: dict[int, list[str]] = {}
    for role in now:
        if role not in then and born.get(role, NONE) != NONE:
            kept.setdefault(born[role], []).append(role)
    for epoch, roles in sorted(kept.items()):
        shown = ", ".join(roles[:3]) + (f" and {len(roles) - 3} more" if len(roles) > 3 else "")
        text += f"; started in epoch {epoch} and still alive: {shown}"
    return text


def _too_few_epochs(ctx: Context, firsts: dict[str, dict[int, int]]) -> str:
    """Why drift compared nothing: the epochs left after ``warmup_epochs``, or no reading
    outside a loop that carries an epoch."""
    seen = sorted({e for by_epoch in firsts.values() for e in by_epoch})
    if not seen:
        return "no reading outside a loop carries an epoch (drift compares epochs' first readings)"
    left = max(len(by_epoch) - ctx.rules.warmup_epochs for by_epoch in firsts.values())
    return (
        f"{plural(max(left, 0), 'epoch')} left to judge after warmup_epochs="
        f"{ctx.rules.warmup_epochs} (epochs seen: {', '.join(map(str, seen))}); drift compares "
        "two or more"
    )


@register_rule("teardown", option="teardown")
def teardown(ctx: Context, limit: int) -> list[Finding]:
    samples, cols = ctx.samples, ctx.columns
    if not len(cols.batch):
        ctx.check("teardown", "session", CheckStatus.SKIP, "no samples", None, limit)
        return []
    starts = cols.where_label(labels.is_run_start)
    ends = cols.where_label(labels.is_run_end)
    first = int(starts[0]) if len(starts) else 0
    # The collected reading at or before the run's start: taken before the model existed.
    anchors = np.flatnonzero(cols.collected[: first + 1])
    start = int(anchors[-1]) if len(anchors) else first
    last_batch = ctx.loop_positions[-1] if ctx.loop_positions else -1
    end = int(ends[-1]) if len(ends) else last_batch + 1
    after = np.flatnonzero(cols.collected[end:])
    if not len(after):
        ctx.check(
            "teardown",
            "session",
            CheckStatus.SKIP,
            "no collected sample after the session end",
            None,
            limit,
        )
        return []
    at = end + int(after[-1])
    metric = ctx.pair_metric(start, at)
    if metric is None:
        ctx.check("teardown", "session", CheckStatus.SKIP, "no comparable readings")
        return []
    residue = ctx.value(at, metric) - ctx.value(start, metric)
    details = (
        f"{samples[at].label} {format_size(residue, signed=True)} vs "
        f"{samples[start].label} ({metric})"
    )
    if residue <= limit:
        ctx.check("teardown", "session", CheckStatus.PASS, details, residue, limit)
        return []
    ctx.check("teardown", "session", CheckStatus.FAIL, details, residue, limit)
    message = (
        f"teardown{ctx.measure.where}: {format_size(residue, signed=True)} still held after the "
        f"session and collection > teardown {ctx.rules.shown('teardown')}"
        f"{ctx.parts(start, at)}"
    )
    evidence = (ctx.evidence(start, metric), ctx.evidence(at, metric))
    return [
        Finding(Kind.TEARDOWN, "session", None, residue, message, None, evidence, rule="teardown")
    ]


@register_rule("check", option=None)
def failed_checks(ctx: Context, _: None) -> list[Finding]:
    """One ``check`` finding per phase with ``CHECK_FAILED`` samples."""
    by_phase: dict[str | None, list[int]] = {}
    for i in np.flatnonzero(ctx.columns.check_failed).tolist():
        by_phase.setdefault(ctx.samples[i].phase, []).append(i)
    findings = []
    for phase, failed in by_phase.items():
        first = ctx.samples[failed[0]]
        note = ((first.note or "").strip().splitlines() or ["no note"])[0]
        count = f" ({len(failed)} failures)" if len(failed) > 1 else ""
        message = f"check failed at {where(first)}: {note}{count}"
        scope = phase if phase is not None else "(no phase)"
        ctx.check("check", scope, CheckStatus.FAIL, f"{len(failed)} CHECK_FAILED: {note}")
        evidence = tuple(ctx.evidence(i, None) for i in dict.fromkeys((failed[0], failed[-1])))
        findings.append(
            Finding(Kind.CHECK, phase, first.epoch, None, message, None, evidence, rule="check")
        )
    return findings


@register_rule("oom", option=None)
def oom(ctx: Context, _: None) -> list[Finding]:
    """One finding per failing batch, with one reading per failure as evidence: a checkpoint
    over an emulated capacity and the OOM event the trainer then reports for the same batch
    are one failure, read at the checkpoint (:func:`_failures`). The error the run raised is
    judged by :func:`harness._rules.judging.judge`."""
    samples = ctx.samples
    findings = []
    for event in group_ooms(samples, np.flatnonzero(ctx.columns.oom).tolist()):
        s = samples[event[0]]
        metric = next(
            (m for m in ("peak", ctx.rules.metric, FALLBACK_METRIC) if s.get(m) is not None),
            None,
        )
        note = ((s.note or "").strip().splitlines() or ["out of memory"])[0]
        findings.append(
            Finding(
                Kind.OOM,
                s.phase,
                s.epoch,
                s.get(metric) if metric else None,
                f"out of memory at {where(s)}: {note}",
                None,
                tuple(ctx.evidence(i, metric) for i in _failures(samples, event)),
                rule="oom",
            )
        )
    return findings


def group_ooms(samples: Sequence[Sample], positions: Sequence[int]) -> list[list[int]]:
    """Out-of-memory samples (``positions``, ascending) as events: those at the same phase,
    epoch and batch one after another are one event (a checkpoint over the capacity and the
    OOM the trainer then reports for that batch). The rule's and the report's grouping."""
    events: list[list[int]] = []
    for i in positions:
        if events and _place(samples[events[-1][0]]) == _place(samples[i]):
            events[-1].append(i)
        else:
            events.append([i])
    return events


def _failures(samples: Sequence[Sample], event: list[int]) -> list[int]:
    """The positions of ``event`` (OOM samples at one place) that are failures of their own:
    an ``OOM`` label right after a checkpoint the capacity stopped is that failure reported
    again, and is left out."""
    kept: list[int] = []
    echoed = False
    for i in event:
        reported = labels.reports_oom(samples[i].label)
        if reported and kept and not echoed and not labels.reports_oom(samples[kept[-1]].label):
            echoed = True
            continue
        kept.append(i)
        echoed = False
    return kept


def _place(s: Sample) -> tuple[str | None, int | None, int | None]:
    return s.phase, s.epoch, s.batch

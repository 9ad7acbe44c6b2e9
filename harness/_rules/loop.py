"""Rules judged per ``(phase, epoch)`` loop: leak, peak and fragmentation.

Leak (P0, ``max_growth``): after ``warmup`` batches, the series is a leak when the
Mann-Kendall test finds an increasing trend (one-sided p < :data:`ALPHA`, at least
:data:`MIN_TREND_POINTS` batches), its growth (:mod:`harness._rules.fit`) exceeds the budget,
its growth did not stop early for good (a plateau is a bounded cache, a warning, unless
``cache_is_leak``), and no re-check clears it. The re-check follows PyTorch's own CUDA leak
check: memory released when the phase ended (back within the budget, half the growth given
back) is still a leak *inside* the phase (``released``); a collected reading still above the budget
confirms it (``retained``); a collected reading back within the budget clears it (reclaimed by
collection); without one the in-loop evidence stands (``unchecked``). See ``docs/rules.md``.
"""

from __future__ import annotations

import numpy as np

from harness._core.units import format_size
from harness._core.wording import plural
from harness._rules.context import Context, Fit, Group, rate, where
from harness._rules.registry import register_rule
from harness._timeline.store import NONE
from harness._verdict.model import CheckStatus, Finding, Kind, Outcome

ALPHA = 0.01
MIN_TREND_POINTS = 6
FRAGMENTATION_FLOOR = 64 * 2**20


@register_rule("max_growth", scope="phase", option="max_growth")
def leak(ctx: Context, group: Group, limit: int) -> list[Finding]:
    limit = max(limit, ctx.measure.floor)
    fit, judged, metric = group.fit, group.judged, group.metric
    if fit is None or metric is None or len(judged) < MIN_TREND_POINTS:
        ctx.check(
            "max_growth",
            group.scope,
            CheckStatus.SKIP,
            f"{plural(len(judged), 'batch', 'batches')} after {ctx.rules.warmup} warm-up: too "
            "few for a trend"
            f" (need {MIN_TREND_POINTS})",
            None,
            limit,
        )
        return []
    summary = _summary(group, fit, metric, limit)
    if not (fit.trend.p < ALPHA and fit.growth > limit):
        ctx.check("max_growth", group.scope, CheckStatus.PASS, summary, fit.growth, limit)
        return []
    unconfirmed = [(name, f) for name, f in group.confirms if f.growth <= limit]
    if unconfirmed:
        name, other = unconfirmed[0]
        details = (
            f"{summary}, but {name} grew {format_size(other.growth, signed=True)}: an "
            "allocator's pages coming and going, not memory outside it"
        )
        ctx.check("max_growth", group.scope, CheckStatus.PASS, details, other.growth, limit)
        return []
    if fit.stopped is not None and not ctx.rules.cache_is_leak:
        return [plateau(ctx, group, summary, limit)]
    checked = _rechecked(ctx, group, fit, metric, limit, summary)
    if checked is None:
        return []
    outcome, note, evidence = checked
    tail = f"; {note}" if note else ""
    ctx.check("max_growth", group.scope, CheckStatus.FAIL, summary + tail, fit.growth, limit)
    message = (
        f"{ctx.measure.leak(group.scope)}{fit.since}: {rate(fit.rate)}, "
        f"{format_size(fit.growth, signed=True)} > max_growth {ctx.rules.shown('max_growth')} "
        f"(trend p={fit.trend.p:.2g}){ctx.parts(judged[0], judged[-1])}{tail}"
    )
    return [
        Finding(
            ctx.measure.kind,
            group.phase,
            group.epoch,
            round(fit.growth),
            message,
            fit.rate,
            evidence,
            outcome=outcome,
        )
    ]


def _summary(group: Group, fit: Fit, metric: str, limit: int) -> str:
    """The growth, where it began (past the budget only), its rate and trend, and how the
    series was read."""
    since = fit.since if fit.growth > limit else ""  # where a growth within budget began is noise
    summary = (
        f"{format_size(fit.growth, signed=True)} over {fit.span:g} batches after warm-up"
        f"{since}, {rate(fit.rate)}, trend p={fit.trend.p:.2g}"
    )
    if len(group.series) < group.batches:
        summary += f" ({metric} read at {len(group.series)} of {group.batches} batches)"
    if not fit.in_order:
        summary += " (batch numbers do not ascend: fitted in the checkpoints' order)"
    return summary


def _rechecked(
    ctx: Context, group: Group, fit: Fit, metric: str, limit: int, summary: str
) -> tuple[Outcome, str, tuple] | None:
    """A leak's re-check after its loop: its outcome, a note and the evidence; None where a
    collected reading is back within the budget (the check passes, said here)."""
    judged = group.judged
    # released: back within the budget, having given back at least half of what the loop grew
    back = fit.baseline + min(limit, fit.growth / 2)
    released, recheck, went_on = after_loop(ctx, group, judged[-1], metric, back)
    evidence = [ctx.evidence(i, metric) for i in (judged[0], judged[-1])]
    if released is not None:
        note = f"released when the phase ended ({_reading(ctx, released, metric, fit)})"
        return Outcome.RELEASED, note, (*evidence, ctx.evidence(released, metric))
    if recheck is not None and ctx.value(recheck, metric) <= fit.baseline + limit:
        details = (
            f"{summary}, but collected {_reading(ctx, recheck, metric, fit)} is back within "
            "max_growth: reclaimed by collection, not a leak"
        )
        ctx.check("max_growth", group.scope, CheckStatus.PASS, details, fit.growth, limit)
        return None
    if recheck is not None:
        note = f"retained after collection ({_reading(ctx, recheck, metric, fit)})"
        return Outcome.RETAINED, note, (*evidence, ctx.evidence(recheck, metric))
    # Where the phase went on after the loop, a collected reading there would have told a leak
    # from what a collection gives back; where it stopped in the loop, none could.
    note = "no collected re-check after the loop" if went_on else ""
    return Outcome.UNCHECKED, note, tuple(evidence)


def plateau(ctx: Context, group: Group, summary: str, limit: int) -> Finding:
    """The finding for a loop whose growth past ``limit`` stopped early and stayed flat: a
    bounded cache (a warning; ``cache_is_leak=True`` keeps it a leak)."""
    fit = group.fit
    assert fit is not None and fit.stopped is not None
    stopped = f"grew {format_size(fit.growth, signed=True)} until batch {fit.stopped:.0f}"
    held = f"then stayed flat for {fit.flat:.0f} batches"
    ctx.check(
        "max_growth",
        group.scope,
        CheckStatus.WARN,
        f"{summary}; {stopped}, {held}: a bounded cache",
        fit.growth,
        limit,
    )
    message = (
        f"bounded cache in {group.scope}: {stopped}, {held} (a cache that fills and stops "
        "growing, not a leak; cache_is_leak=True fails it)"
    )
    evidence = tuple(ctx.evidence(i, group.metric) for i in (group.judged[0], group.judged[-1]))
    return Finding(
        Kind.CACHE,
        group.phase,
        group.epoch,
        round(fit.growth),
        message,
        0.0,
        evidence,
        rule="max_growth",
    )


@register_rule("max_peak", scope="phase", option="max_peak")
def peak(ctx: Context, group: Group, limit: int) -> list[Finding]:
    top = group.peak
    if top is None:
        ctx.check("max_peak", group.scope, CheckStatus.SKIP, "no readings", None, limit)
        return []
    at = where(ctx.samples[top.at])
    rise = format_size(top.rise, signed=True)
    details = f"peak {format_size(top.value)} at {at}, {rise} above start"
    if top.rise <= limit:
        ctx.check("max_peak", group.scope, CheckStatus.PASS, details, top.rise, limit)
        return []
    ctx.check("max_peak", group.scope, CheckStatus.FAIL, details, top.rise, limit)
    limit_text = ctx.rules.shown("max_peak")
    message = f"peak in {group.scope}: {rise} above start at {at} > max_peak {limit_text}"
    evidence = (ctx.evidence(top.start, top.base), ctx.evidence(top.at, top.metric))
    return [
        Finding(
            Kind.PEAK, group.phase, group.epoch, top.rise, message, None, evidence, rule="max_peak"
        )
    ]


@register_rule("fragmentation", scope="phase", option=None)
def fragmentation(ctx: Context, group: Group, _: None) -> list[Finding]:
    """On CUDA, ``reserved - allocated`` grows with a trend by more than
    ``max(FRAGMENTATION_FLOOR, max_growth)`` while ``allocated`` grows by under a quarter of
    that: a warning that does not fail the verdict."""
    judged, cols = group.judged, ctx.columns
    if len(judged) < MIN_TREND_POINTS or not all(
        cols.present(m)[judged].all() for m in ("reserved", "allocated")
    ):
        return []
    x, reserved = ctx.values(judged, "reserved")
    x, used = ctx.values(judged, "allocated")
    allocated = Fit.of(x, used)
    gap = Fit.of(x, reserved - used)
    assert gap is not None and allocated is not None
    limit = max(FRAGMENTATION_FLOOR, ctx.rules.max_growth or 0)
    details = (
        f"reserved - allocated {format_size(gap.growth, signed=True)}, "
        f"allocated {format_size(allocated.growth, signed=True)}"
    )
    if not (gap.trend.p < ALPHA and gap.growth > limit and allocated.growth < gap.growth / 4):
        ctx.check("fragmentation", group.scope, CheckStatus.PASS, details, gap.growth, limit)
        return []
    ctx.check("fragmentation", group.scope, CheckStatus.WARN, details, gap.growth, limit)
    message = (
        f"fragmentation in {group.scope}: reserved grew {format_size(gap.growth, signed=True)} "
        f"more than allocated ({format_size(allocated.growth, signed=True)})"
    )
    evidence = tuple(ctx.evidence(i, "reserved") for i in (judged[0], judged[-1]))
    return [
        Finding(
            Kind.FRAGMENTATION,
            group.phase,
            group.epoch,
            round(gap.growth),
            message,
            gap.trend.slope,
            evidence,
            rule="fragmentation",
        )
    ]


def after_loop(
    ctx: Context, group: Group, last: int, metric: str, level: float
) -> tuple[int | None, int | None, bool]:
    """Between the loop's last batch and the next loop, among the samples of the same group:
    the first uncollected one, before any collection, at or below ``level``; the last
    collected one (positions, or None); and whether one is not of a batch (the phase went on
    after the loop). Samples of other phases never clear a leak: what the code frees after the
    phase (a function returning, say) says nothing of the phase."""
    cols = ctx.columns
    phase, epoch = cols.phase[last], cols.epoch[last]
    loops = ctx.loop_positions.array
    later = loops[np.searchsorted(loops, last, side="right") :]
    others = later[(cols.phase[later] != phase) | (cols.epoch[later] != epoch)]
    stop = int(others[0]) if len(others) else len(cols.batch)
    span = np.arange(last + 1, stop)
    window = span[cols.present(metric)[span]]
    own = (cols.phase[window] == phase) & (cols.epoch[window] == epoch)
    went_on = bool((own & (cols.batch[window] == NONE)).any())  # an OOM in the loop stops it
    collected = window[own & cols.collected[window]]
    if len(collected):
        own &= window < collected[0]
    low = window[own & (cols.values(metric)[window] <= level)]
    found = (int(low[0]) if len(low) else None), (int(collected[-1]) if len(collected) else None)
    return (*found, went_on)


def _reading(ctx: Context, i: int, metric: str, fit: Fit) -> str:
    """``LABEL +x.xMB`` relative to the loop's starting level."""
    value = ctx.value(i, metric)
    return f"{ctx.samples[i].label} {format_size(value - fit.baseline, signed=True)}"

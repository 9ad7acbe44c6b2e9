"""Growth seen beyond one run: caches that stop growing, and trends too slow to cross a budget
in a short run.

Bounded cache (P2, a warning): a library cache keyed by input shape (oneDNN's primitive cache,
cuDNN workspaces, ``torch.compile`` graphs, a mask cached per sequence length) grows at every
new shape and stops once every shape was seen. Within one epoch that is a trend like any leak;
over several it is growth that shrinks epoch over epoch toward nothing. :func:`bounded` runs
after the loop rules and turns a phase's leak findings into one ``cache`` finding when, over at
least :data:`MIN_EPOCHS` judged epochs, no epoch grew more than the one before it (within
:data:`TOLERANCE` of the first epoch's growth) and the last grew by at most :data:`FLAT` of
the first. A real leak grows about as much every epoch and stays a
leak. ``cache_is_leak=True`` keeps every leak blocking.

Projection (P0 leak, ``project_to``): a short test sees a few hundred batches of a run that
takes many thousands. A phase's series whose trend is significant (p < ``ALPHA``, at least
``MIN_TREND_POINTS`` batches after warm-up) has its rate (after its onset; none once its
growth stopped on a plateau) multiplied by ``project_to`` batches; the phase fails when that
exceeds ``max_projected``, or ``max_growth`` when that is not set. Slopes under
:data:`SLOPE_FLOOR` are not projected: a clean CPU loop's malloc drifts by 17 to 62 B/batch (3
to 11 KB over 176 batches), and torch keeps a few small Python objects at each backward pass
for its first thousands (a cache that fills ever more slowly: clean training loops grew by 148
B/batch over the TFT's 704 batches and by 195 B/batch over 54 batches of a small model), which
a long enough run would turn into any size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from itertools import pairwise

from harness._core.units import format_size
from harness._core.wording import plural
from harness._rules.context import Context, Group, rate
from harness._rules.loop import ALPHA, MIN_TREND_POINTS
from harness._rules.registry import register_rule
from harness._verdict.model import CheckStatus, Finding, Kind, PhaseStats

MIN_EPOCHS = 2
FLAT = 0.25
TOLERANCE = 0.1
LEAK_RULES = ("max_growth", "project_to")
SLOPE_FLOOR = 512


@register_rule("project_to", scope="phase", option="project_to")
def projection(ctx: Context, group: Group, batches: int) -> list[Finding]:
    """A significant slope extended to ``batches`` batches, against ``max_projected`` (else
    ``max_growth``)."""
    budget = ctx.rules.budget("max_projected")
    limit = ctx.rules.size(budget) if budget is not None else None
    fit = group.fit
    if budget is None or limit is None:
        ctx.check(
            "project_to",
            group.scope,
            CheckStatus.SKIP,
            "no budget: set max_projected or max_growth",
        )
        return []
    if fit is None or len(group.judged) < MIN_TREND_POINTS:
        ctx.check(
            "project_to",
            group.scope,
            CheckStatus.SKIP,
            f"{plural(len(group.judged), 'batch', 'batches')} after {ctx.rules.warmup} warm-up: "
            "too few for a trend"
            f" (need {MIN_TREND_POINTS})",
            None,
            limit,
        )
        return []
    t = fit.trend
    # the rate the loop grows at by its end: after its onset, nothing once growth stopped
    slope = 0.0 if fit.stopped is not None else fit.rate
    projected = slope * batches
    summary = (
        f"{rate(slope)} x {batches} batches = {format_size(projected, signed=True)} "
        f"(trend p={t.p:.2g}, {format_size(fit.growth, signed=True)} over {fit.span:g} "
        "batches here)"
    )
    if fit.stopped is not None:
        summary += f"; growth stopped at batch {fit.stopped:.0f}"
    if not (t.p < ALPHA and slope >= SLOPE_FLOOR and projected > limit):
        ctx.check("project_to", group.scope, CheckStatus.PASS, summary, projected, limit)
        return []
    ctx.check("project_to", group.scope, CheckStatus.FAIL, summary, projected, limit)
    message = (
        f"projected {ctx.measure.leak(group.scope)}{fit.since}: {rate(slope)} x {batches} "
        "batches = "
        f"{format_size(projected, signed=True)} > {budget} {ctx.rules.shown(budget)} "
        f"(trend p={t.p:.2g}; {format_size(fit.growth, signed=True)} over {fit.span:g} "
        "batches in this run)"
    )
    evidence = tuple(ctx.evidence(i, group.metric) for i in (group.judged[0], group.judged[-1]))
    return [
        Finding(
            ctx.measure.kind,
            group.phase,
            group.epoch,
            round(projected),
            message,
            slope,
            evidence,
            rule="project_to",
        )
    ]


def bounded(
    ctx: Context, findings: Sequence[Finding], phases: Sequence[PhaseStats]
) -> tuple[list[Finding], list[PhaseStats]]:
    """``findings`` with the leaks of each phase whose growth saturates replaced by one
    ``cache`` finding, and ``phases`` with those epochs' leak checks turned to warnings."""
    if ctx.rules.cache_is_leak:
        return list(findings), list(phases)
    kept: list[Finding] = []
    caches: dict[str | None, Finding | None] = {}
    for finding in findings:
        if finding.kind != Kind.LEAK or finding.rule not in LEAK_RULES:
            kept.append(finding)
            continue
        if finding.phase not in caches:
            caches[finding.phase] = _cache(ctx, finding.phase)
        cache = caches[finding.phase]
        if cache is None:
            kept.append(finding)
        elif cache not in kept:
            kept.append(cache)
    saturated = {phase for phase, cache in caches.items() if cache is not None}
    if not saturated:
        return kept, list(phases)
    scopes = {g.scope for g in ctx.groups if g.phase in saturated}
    for n, check in enumerate(ctx.checks):
        if check.rule in LEAK_RULES and check.scope in scopes and check.status == CheckStatus.FAIL:
            details = f"{check.details}; growth saturates across epochs: bounded cache"
            ctx.checks[n] = replace(check, status=CheckStatus.WARN, details=details)
    return kept, [_restated(ctx, p) if p.phase in saturated else p for p in phases]


def saturating(ctx: Context, phase: str | None) -> list[Group] | None:
    """``phase``'s judged epochs, in order, when its growth saturates (see the module doc),
    else None; always None with ``cache_is_leak``."""
    if ctx.rules.cache_is_leak:
        return None
    groups = sorted(
        (
            g
            for g in ctx.groups
            if g.phase == phase
            and g.epoch is not None
            and g.fit is not None
            and len(g.judged) >= MIN_TREND_POINTS
        ),
        key=lambda g: g.epoch or 0,
    )
    if len(groups) < MIN_EPOCHS:
        return None
    growths = [max(g.fit.growth, 0.0) for g in groups if g.fit is not None]
    first = growths[0]
    if first <= 0:
        return None
    shrinking = all(b <= a + TOLERANCE * first for a, b in pairwise(growths))
    return groups if shrinking and growths[-1] <= FLAT * first else None


def cached_between(ctx: Context, start: int, end: int, metric: str) -> tuple[float, list[str]]:
    """The growth of ``metric`` that bounded caches account for between positions ``start``
    and ``end``: the epochs, lying wholly between them, of each phase whose growth the verdict
    calls a bounded cache (it saturates across epochs, and the leak rules failed it or a loop
    of it filled and stayed flat), from their first reading to their last; and those phases'
    names."""
    total, phases = 0.0, []
    failed = {c.scope for c in ctx.checks if c.rule in LEAK_RULES and c.status == CheckStatus.FAIL}
    for phase in dict.fromkeys(g.phase for g in ctx.groups):
        groups = saturating(ctx, phase) or []
        filled = any(g.fit is not None and g.fit.stopped is not None for g in groups)
        if not (filled or failed & {g.scope for g in groups}):
            continue
        for group in groups:
            first, last = group.indices[0], group.indices[-1]
            if start <= first and last <= end and ctx.pair_metric(first, last) == metric:
                total += ctx.value(last, metric) - ctx.value(first, metric)
                phases.append(phase if phase is not None else "(no phase)")
    return total, list(dict.fromkeys(phases))


def _cache(ctx: Context, phase: str | None) -> Finding | None:
    """The ``cache`` finding for ``phase`` when its growth saturates, else None."""
    groups = saturating(ctx, phase)
    if groups is None:
        return None
    growths = [max(g.fit.growth, 0.0) for g in groups if g.fit is not None]
    last = groups[-1]
    per_epoch = ", ".join(
        f"{format_size(g, signed=True)} in epoch {grp.epoch}"
        for g, grp in zip(growths, groups, strict=True)
    )
    name = phase if phase is not None else "(no phase)"
    details = f"{per_epoch}: shrinks toward zero"
    ctx.check("saturation", name, CheckStatus.WARN, details, sum(growths))
    message = (
        f"bounded cache in {name}: grew {per_epoch}, shrinking toward zero (a cache that stops "
        "growing once it has seen every input shape, not a leak; cache_is_leak=True fails it)"
    )
    top = groups[0]
    evidence = (
        ctx.evidence(top.judged[0], top.metric),
        ctx.evidence(last.judged[-1], last.metric),
    )
    return Finding(
        Kind.CACHE,
        phase,
        top.epoch,
        round(sum(growths)),
        message,
        top.fit.trend.slope if top.fit else None,
        evidence,
        rule="saturation",
    )


def _restated(ctx: Context, stats: PhaseStats) -> PhaseStats:
    """A saturated phase's epoch: FAIL only while another rule still fails it."""
    if stats.status != CheckStatus.FAIL:
        return stats
    scope = next((g.scope for g in ctx.groups if g.key == (stats.phase, stats.epoch)), None)
    failing = any(c.scope == scope and c.status == CheckStatus.FAIL for c in ctx.checks)
    return stats if failing else replace(stats, status=CheckStatus.WARN)

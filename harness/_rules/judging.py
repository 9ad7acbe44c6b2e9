"""Judge a memory timeline: ``judge(samples, rules) -> Verdict``.

Every rule is registered by name (:mod:`harness._rules.registry`); the built-in ones live in
:mod:`harness._rules.loop` (leak, peak, fragmentation: per ``(phase, epoch)``) and
:mod:`harness._rules.per_run` (drift, teardown, trainer checks, OOM), and the cross-rank
``rank_outlier`` of :mod:`harness._rules.rank_outlier` is registered here. They share one statistics
pass (:class:`~harness._rules.context.Context`). Per phase, the worst group's finding of each rule
is reported; every group's numbers and checks are kept.

A registered rule that raises, exits or returns something other than findings could not judge,
and an option in ``Rules.custom`` that no registered rule reads was never judged: either is an
ERROR check naming it. Status (:func:`decide`, which a merged distributed run shares): ERROR when
``error`` is given and is not an OOM, or a rule could not judge, else FAIL when any blocking
finding exists, else ERROR when a rule judged nothing, else PASS.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import harness._core.labels as labels
from harness._core.errors import BadArgument, Raised
from harness._core.wording import plural
from harness._measure.sample import Sample
from harness._rules import (  # noqa: F401  (registers the rules)
    child_growth,
    loop,
    per_run,
    saturation,
)
from harness._rules import rank_outlier as _ranks
from harness._rules.context import Context, Group
from harness._rules.measures import beside
from harness._rules.mistakes import nothing_recorded, recorded_nothing, unmatched_phase
from harness._rules.registry import Rule, register_rule, registered
from harness._timeline.store import SampleStore
from harness._verdict.model import (
    CONFIGURATION,
    RAISED,
    Check,
    CheckStatus,
    Finding,
    Kind,
    PhaseStats,
    Status,
    Verdict,
)
from harness._verdict.options import Rules
from harness._verdict.schema import check_finding

register_rule(_ranks.RULE, _ranks.rank_outlier, scope="run", option=None)


def judge(
    samples: Iterable[Sample],
    rules: Rules | Mapping[str, Any] | None = None,
    *,
    error: BaseException | labels.Raised | str | None = None,
) -> Verdict:
    """Judge ``samples`` (in timeline order) against ``rules`` (a :class:`Rules` or a mapping
    of its fields). ``error`` is what the run raised, if anything: an out-of-memory error
    becomes an ``oom`` finding, anything else makes the status ERROR (the timeline is still
    judged). Refuses what is none of these with :class:`~harness._core.errors.BadArgument`."""
    if rules is None:
        rules = Rules()
    elif not isinstance(rules, Rules):
        rules = Rules.from_dict(rules)
    if error is not None and not isinstance(error, (BaseException, labels.Raised, str)):
        raise BadArgument(f"error: expected an exception, a Raised or text, got {error!r}")
    ctx = Context(_samples(samples), rules)
    findings: list[Finding] = []
    phases: list[PhaseStats] = []
    seen = ", ".join(repr(p) for p in ctx.phases_seen()) or "none"
    for phase in rules.phase or ():
        if all(g.phase != phase for g in ctx.groups):
            said = unmatched_phase(phase, ctx.phases_seen(), ctx.samples)
            ctx.check(CONFIGURATION, phase, CheckStatus.SKIP, said)
    broken = _unread_options(ctx)
    phase_rules = [r for r in registered() if r.scope == "phase"]
    by_phase: dict[str | None, list[list[Finding]]] = {}
    for group in ctx.groups:
        if rules.selects(group.phase):
            found, stats = _judge_group(ctx, group, phase_rules, broken)
            phases.append(stats)
            by_phase.setdefault(group.phase, []).append(found)
    for results in by_phase.values():
        findings += _worst_per_rule(results)
    for rule in registered():
        if rule.scope == "run":
            enabled, option = rule.enabled_with(rules)
            if enabled:
                findings += _apply(ctx, rule, "run", broken, ctx, option)
    findings, phases = saturation.bounded(ctx, findings, phases)
    more, others = _judge_beside(ctx, broken)
    findings += _not_leaking_alike(findings, more)
    message = _judge_error(ctx, findings, error)
    if message is None and broken:
        message = "; ".join(dict.fromkeys(broken))
    unjudged = None if rules.allow_unjudged else _unjudged(ctx, findings, seen)
    if unjudged is not None:
        ctx.check(unjudged[0], "run", CheckStatus.ERROR, unjudged[1])
    status, message = decide(findings, error=message, unjudged=unjudged and unjudged[1])
    checks = (*ctx.checks, *(c for other in others for c in other.checks))
    beside = tuple(stats for other in others for stats in other.phases)
    return Verdict(status, tuple(findings), tuple(phases), checks, rules, message, beside)


def _samples(given: object) -> Sequence[Sample]:
    """``given`` as the samples a context reads: a store as it is, else a list of samples."""
    if isinstance(given, SampleStore):
        return given
    if isinstance(given, (str, bytes, Mapping)) or not isinstance(given, Iterable):
        shown = type(given).__name__
        raise BadArgument(f"samples: expected samples in timeline order, got {shown}")
    samples = list(given)
    stray = next((s for s in samples if not isinstance(s, Sample)), None)
    if stray is not None:
        problem = f"expected samples in timeline order, got a {type(stray).__name__} among them"
        raise BadArgument(problem, field="samples")
    return samples


def _not_leaking_alike(findings: list[Finding], beside: list[Finding]) -> list[Finding]:
    """``beside`` less the growth outside what leakgate reads in a phase whose live heap
    leaks, drifts or fills a cache too: a heap that grows refills pages it had given back and
    keeps pages it frees, which moves what no counter explains as much (a kept autograd graph
    moved it by +4.6 MiB beside its own +3.7 MiB). Fixed first, the live heap's leak shows
    what is left."""
    leaking = {f.phase for f in findings if f.kind in (Kind.LEAK, Kind.DRIFT, Kind.CACHE)}
    return [f for f in beside if not (f.kind == Kind.OUTSIDE and f.phase in leaking)]


class _Beside:
    """What judging one measure beside the rules' metric found: its checks (their scope
    naming the measure) and each loop's numbers."""

    def __init__(self, checks: list[Check], phases: list[PhaseStats]) -> None:
        self.checks, self.phases = checks, phases


def _judge_beside(ctx: Context, broken: list[str]) -> tuple[list[Finding], list[_Beside]]:
    """Each measure beside the rules' metric that the run recorded (:mod:`harness._rules.
    measures`), judged by its rules as the rules' metric is: its findings, and its checks and
    loops' numbers."""
    findings: list[Finding] = []
    judged: list[_Beside] = []
    for measure in beside(ctx.columns, ctx.rules.host):
        rules = replace(ctx.rules, metric=measure.metric)
        sub = Context(ctx.samples, rules, columns=ctx.columns, measure=measure)
        chosen = [r for r in registered() if r.name in measure.rules]
        by_phase: dict[str | None, list[list[Finding]]] = {}
        phases: list[PhaseStats] = []
        in_loops = [r for r in chosen if r.scope == "phase"]
        for group in sub.groups if in_loops else ():
            if group.metric is not None and group.series and rules.selects(group.phase):
                found, stats = _judge_group(sub, group, in_loops, broken)
                phases.append(stats)
                by_phase.setdefault(group.phase, []).append(found)
        found = [f for results in by_phase.values() for f in _worst_per_rule(results)]
        for rule in chosen:
            enabled, option = rule.enabled_with(rules)
            if rule.scope == "run" and enabled:
                found += _apply(sub, rule, "run", broken, sub, option)
        found, phases = saturation.bounded(sub, found, phases)
        findings += found
        tag = f" ({measure.metric})"
        judged.append(_Beside([replace(c, scope=c.scope + tag) for c in sub.checks], phases))
    return findings, judged


def decide(
    findings: Iterable[Finding], *, error: str | None = None, unjudged: str | None = None
) -> tuple[Status, str | None]:
    """A verdict's status and its error text: ERROR for what stopped the run (``error``), else
    FAIL for a blocking finding, else ERROR for a rule that judged nothing it was asked to
    (``unjudged``), else PASS."""
    if error is not None:
        return Status.ERROR, error
    if any(f.blocking for f in findings):
        return Status.FAIL, None
    if unjudged is not None:
        return Status.ERROR, unjudged
    return Status.PASS, None


def _apply(ctx: Context, rule: Rule, scope: str, broken: list[str], *args: Any) -> list[Finding]:
    """Run one rule on ``scope``: its findings, carrying its name. A rule that raises, exits or
    returns anything but findings judged nothing: an ERROR check on ``scope`` and a line in
    ``broken`` say so, and the run goes on."""
    try:
        found = rule.function(*args)
        if isinstance(found, (str, bytes, Mapping)) or not isinstance(found, Iterable):
            raise BadArgument(f"returned {type(found).__name__}, not a list of findings")
        found = list(found)
        for item in found:
            if not isinstance(item, Finding):
                raise BadArgument(f"returned a {type(item).__name__} among its findings")
            check_finding(item)
    except (Exception, SystemExit) as exc:
        why = f"rule {rule.name!r} could not judge: {Raised.of(exc)}"
        ctx.check(rule.name, scope, CheckStatus.ERROR, why)
        broken.append(why)
        return []
    return [f if f.rule == rule.name else replace(f, rule=rule.name) for f in found]


def _unread_options(ctx: Context) -> list[str]:
    """Options in ``Rules.custom`` that no registered rule reads (a rule registered by a
    conftest that is not loaded now, a misspelt name): each an ERROR check naming it."""
    reads = {r.name for r in registered() if r.option == "custom"}
    unread = []
    for name in ctx.rules.custom:
        if name not in reads:
            why = f"rule option {name!r} is read by no registered rule, so it was not judged"
            ctx.check(name, "run", CheckStatus.ERROR, why)
            unread.append(why)
    return unread


def _unjudged(ctx: Context, findings: list[Finding], seen: str) -> tuple[str, str] | None:
    """Why the verdict has no evidence for a rule it was asked to apply, as the rule of its
    check and its text, or None: a configuration mistake (a selected phase that never appeared,
    rules over a run that recorded no checkpoint), or an enabled rule that judged nothing (no
    per-batch checkpoints, a loop shorter than its warm-up, no collected reading after the
    run)."""
    missing = [c.details for c in ctx.checks if c.rule == CONFIGURATION]
    if missing:
        return CONFIGURATION, "; ".join(missing)
    reasons = []
    idle = []
    for rule in registered():
        enabled, _ = rule.enabled_with(ctx.rules)
        if not enabled or rule.option is None:
            continue
        checks = [c for c in ctx.checks if c.rule == rule.name]
        if any(c.status != CheckStatus.SKIP for c in checks):
            continue
        if any(f.rule == rule.name for f in findings):
            continue
        why = checks[0].details if checks else f"no per-batch checkpoints (phases seen: {seen})"
        reasons.append(f"{rule.name} judged nothing: {why}")
        idle.append(rule)
    if idle and recorded_nothing(ctx.samples):
        return CONFIGURATION, nothing_recorded(ctx.rules, idle)
    return ("evidence", "; ".join(reasons)) if reasons else None


def _judge_group(
    ctx: Context, group: Group, rules: list[Rule], broken: list[str]
) -> tuple[list[Finding], PhaseStats]:
    before = len(ctx.checks)
    found: list[Finding] = []
    if group.metric is None or not group.series:
        ctx.check(
            "readings", group.scope, CheckStatus.SKIP, f"no {ctx.rules.metric} or rss readings"
        )
    else:
        for rule in rules:
            enabled, option = rule.enabled_with(ctx.rules)
            if enabled:
                found += _apply(ctx, rule, group.scope, broken, ctx, group, option)
    status = CheckStatus.worst((c.status for c in ctx.checks[before:]), CheckStatus.PASS)
    fit, peak = group.fit, group.peak
    metric = group.metric
    stats = PhaseStats(
        phase=group.phase,
        epoch=group.epoch,
        label=group.label,
        metric=metric,
        status=status,
        batches=group.batches if metric else len(group.looped),
        judged=len(group.judged),
        start=ctx.samples[group.start].get(metric) if metric and group.start is not None else None,
        end=ctx.samples[group.end].get(metric) if metric and group.end is not None else None,
        growth=fit.growth if fit else None,
        slope=fit.rate if fit else None,
        p_value=fit.trend.p if fit else None,
        noise=fit.trend.noise if fit else None,
        peak=peak.value if peak else None,
        peak_rise=peak.rise if peak else None,
        budget=ctx.rules.max_growth,
        peak_metric=peak.base if peak else None,
        baseline=fit.baseline if fit else None,
        baseline_batches=round(fit.line.edge) + 1 if fit else None,
        onset=fit.onset if fit else None,
        stopped=fit.stopped if fit else None,
    )
    return found, stats


def _worst_per_rule(results: list[list[Finding]]) -> list[Finding]:
    """One finding per rule for a phase: its worst epoch, saying how many epochs broke it."""
    worst: list[Finding] = []
    for rule in [r.name for r in registered()]:
        hits = [f for found in results for f in found if f.rule == rule]
        if not hits:
            continue
        top = max(hits, key=lambda f: f.bytes or 0)
        if len(results) > 1:
            top = replace(top, message=f"{top.message} ({len(hits)} of {len(results)} epochs)")
        worst.append(top)
    return worst


def _judge_error(
    ctx: Context, findings: list[Finding], error: BaseException | labels.Raised | str | None
) -> str | None:
    """Add the run-wide OOM check (and a finding for an OOM the run raised without an OOM
    event); return the error's text when it is not an OOM."""
    ooms = [f for f in findings if f.kind == Kind.OOM]
    text = None if error is None else str(Raised.of(error))
    error_is_oom = error is not None and labels.is_oom_error(error)
    if error_is_oom and not ooms:
        findings.append(Finding(Kind.OOM, None, None, None, f"out of memory: {text}", rule="oom"))
    failed = bool(ooms) or error_is_oom
    details = plural(len(ooms), "OOM event") + (f"; raised {text}" if error_is_oom else "")
    ctx.check("oom", "run", CheckStatus.FAIL if failed else CheckStatus.PASS, details)
    if error is None or error_is_oom:
        return None
    ctx.check(RAISED, "run", CheckStatus.ERROR, f"raised {text}")
    return text

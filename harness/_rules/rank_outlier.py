"""The cross-rank rule of a distributed run: one rank whose memory stands out from the others'.

A DDP leak often lives on one rank only (rank 0 gathering every batch, a hook added on one rank).
Each rank's own verdict may miss it when its budget is loose or unset; comparing the ranks does
not. :func:`judge_ranks` runs every registered rule marked ``across_ranks`` over a
:class:`RankContext` (the ranks' verdicts); ``rank_outlier`` is the built-in one.

``rank_outlier``, per ``(phase, epoch)`` that at least two ranks judged, reads what each rank's
own rules read (:class:`~harness._verdict.model.PhaseStats`, in the rules' metric):

- growth (after warm-up, as the leak rule measures it: :mod:`harness._rules.fit`): a rank with
  its own increasing trend (p < :data:`~harness._rules.loop.ALPHA`) whose growth exceeds the
  other ranks' median by more than the gap, and is more than twice that median, is a ``leak``
  finding naming the rank. The gap is ``max_growth`` (:data:`DEFAULT_GAP` where it is unset),
  or the noise floor where that is higher: :data:`NOISE_SIGMAS` times the robust spread
  (:func:`~harness._core.stats.spread`, as the history's creep gate measures its noise) of the
  other ranks, the ranks taken as clean: their readings around their own trend lines, and their
  growths from one rank to another where there are two or more;
- peak rise, only where ``max_peak`` is set and the peak is a reading of the judged metric
  (``allocated`` on CUDA): the same test with ``max_peak`` as the gap (and the other ranks'
  spread of peaks as the floor), unless that rank's growth stood out already (its peak is then
  the same memory). The CPU's peak is the resident high-water mark (``VmHWM``), which moves by
  MiBs between identical ranks (pages a freed block leaves touched): it is shown in the check
  as evidence, never judged alone.

Registered by :mod:`harness._rules` with ``option=None``: an ordinary, one-timeline judgement calls
it with a plain :class:`~harness._rules.context.Context`, and it judges nothing there.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from harness._core.stats import NOISE_SIGMAS, spread
from harness._core.units import format_rate, format_size
from harness._rules.context import CheckLog, scope
from harness._rules.loop import ALPHA
from harness._rules.registry import registered
from harness._verdict.model import Check, CheckStatus, Finding, Kind, PhaseStats, Verdict
from harness._verdict.options import Rules

RULE = "rank_outlier"
DEFAULT_GAP = 2**20
"""The gap a rank's growth must stand out by when the rules set no ``max_growth`` (1 MiB)."""


@dataclass
class RankContext(CheckLog):
    """What a cross-rank rule reads: the rules and every rank's verdict, by rank. It records
    its outcomes with :meth:`check`, as a one-timeline rule does on its context."""

    rules: Rules
    verdicts: Mapping[int, Verdict]
    checks: list[Check] = field(default_factory=list)

    def phases(self) -> dict[tuple[str | None, int | None], dict[int, PhaseStats]]:
        """Each judged ``(phase, epoch)``, with its statistics on every rank that judged it."""
        found: dict[tuple[str | None, int | None], dict[int, PhaseStats]] = {}
        for rank, verdict in sorted(self.verdicts.items()):
            for stats in verdict.phases:
                found.setdefault((stats.phase, stats.epoch), {})[rank] = stats
        return found


def across_ranks(function: Any) -> Any:
    """Mark a rule function as one that reads a :class:`RankContext`."""
    function.across_ranks = True
    return function


def judge_ranks(verdicts: Mapping[int, Verdict], rules: Rules) -> tuple[list[Finding], list[Check]]:
    """Run the cross-rank rules over the ranks' verdicts; their findings and checks."""
    ctx = RankContext(rules, verdicts)
    findings: list[Finding] = []
    for rule in registered():
        if rule.scope == "run" and getattr(rule.function, "across_ranks", False):
            enabled, option = rule.enabled_with(rules)
            if enabled:
                findings += [
                    f if f.rule == rule.name else replace(f, rule=rule.name)
                    for f in rule.function(ctx, option)
                ]
    return findings, ctx.checks


@dataclass(frozen=True)
class _Measure:
    """One thing the ranks are compared on: a :class:`PhaseStats` field, the gap a rank must
    stand out by, the finding's kind and verb, and whether the ranks' own residual noise
    bounds it (growth: it is read from a trend line)."""

    name: str
    gap: int
    kind: Kind
    verb: str
    trended: bool


@across_ranks
def rank_outlier(ctx: Any, option: Any = None) -> list[Finding]:
    """A rank whose growth or peak rise stands out from the other ranks' (see the module)."""
    if not isinstance(ctx, RankContext):
        return []
    if len(ctx.verdicts) < 2:
        ctx.check(RULE, "run", CheckStatus.SKIP, "one rank: nothing to compare")
        return []
    rules = ctx.rules
    growth = _Measure("growth", rules.max_growth or DEFAULT_GAP, Kind.LEAK, "grew", True)
    peak = (
        None
        if rules.max_peak is None
        else _Measure("peak_rise", rules.max_peak, Kind.PEAK, "peaked", False)
    )
    world = len(ctx.verdicts)
    worst: dict[tuple[int, str | None, Kind], Finding] = {}
    for (phase, epoch), by_rank in ctx.phases().items():
        where = scope(phase, epoch)
        if len(by_rank) < 2:
            ctx.check(RULE, where, CheckStatus.SKIP, "judged on one rank only")
            continue
        found = _stand_out(by_rank, growth, world)
        leaking = {rank for rank, _ in found}
        if peak is not None and _judged_peak(by_rank):
            found += [(r, f) for r, f in _stand_out(by_rank, peak, world) if r not in leaking]
        details = _details(by_rank, peak is not None)
        if found:
            named = "; ".join(f.message for _, f in found)
            ctx.check(RULE, where, CheckStatus.FAIL, f"{named} ({details})", limit=growth.gap)
        else:
            ctx.check(RULE, where, CheckStatus.PASS, f"no rank stands out: {details}")
        for rank, finding in found:
            key = (rank, phase, finding.kind)
            if key not in worst or (finding.bytes or 0) > (worst[key].bytes or 0):
                worst[key] = finding
    return list(worst.values())


def _judged_peak(by_rank: Mapping[int, PhaseStats]) -> bool:
    """Whether every rank's peak is a reading of the metric its growth is judged on (not a
    resident high-water mark beside it)."""
    return all(s.peak_metric is not None and s.peak_metric == s.metric for s in by_rank.values())


def _details(by_rank: Mapping[int, PhaseStats], peak: bool) -> str:
    """Each rank's growth, with its peak rise as evidence (named by its metric where that is
    not the judged one, or where ``max_peak`` is unset)."""
    shown = []
    for rank, stats in by_rank.items():
        rise = _signed(stats.peak_rise)
        if stats.peak_metric and (stats.peak_metric != stats.metric or not peak):
            rise += f" {stats.peak_metric} high-water mark"
        shown.append(f"rank {rank} {_signed(stats.growth)} / {rise}")
    return f"growth / peak rise by rank: {', '.join(shown)}"


def _signed(value: float | None) -> str:
    return format_size(value, signed=True)


def _noise_floor(others: list[PhaseStats], measure: str, trended: bool) -> float:
    """:data:`NOISE_SIGMAS` times the clean ranks' robust spread in ``measure``: of their
    readings around their trend lines (``trended``: the median of their ``noise``), and of their
    values from one rank to another where there are two or more."""
    sigmas = []
    if trended:
        noises = [s.noise for s in others if s.noise is not None]
        if noises:
            sigmas.append(float(statistics.median(noises)))
    values = [getattr(s, measure) for s in others if getattr(s, measure) is not None]
    if len(values) > 1:
        sigmas.append(spread(values))
    return NOISE_SIGMAS * max(sigmas, default=0.0)


def _stand_out(
    by_rank: Mapping[int, PhaseStats], measure: _Measure, world: int
) -> list[tuple[int, Finding]]:
    """The ranks whose ``measure`` exceeds the other ranks' median by more than its gap (or
    their noise floor, where higher) and by more than that median again (a leak needs its own
    increasing trend too)."""
    found = []
    for rank, stats in by_rank.items():
        value = getattr(stats, measure.name)
        others = [
            s for r, s in by_rank.items() if r != rank and getattr(s, measure.name) is not None
        ]
        if value is None or not others:
            continue
        median = max(0.0, float(statistics.median(getattr(s, measure.name) for s in others)))
        floor = _noise_floor(others, measure.name, measure.trended)
        gap = max(float(measure.gap), floor)
        if not (value - median > gap and value > 2 * median):
            continue
        if measure.kind == Kind.LEAK and not (stats.p_value is not None and stats.p_value < ALPHA):
            continue
        leak = measure.kind == Kind.LEAK
        slope = f" ({format_rate(stats.slope)})" if leak else ""
        allowed = f"gap allowed {format_size(gap)}"
        if floor > measure.gap:
            allowed += ": the other ranks' noise floor"
        message = (
            f"rank {rank} of {world} stands out: {stats.phase or 'the run'} {measure.verb} "
            f"{_signed(value)}{slope} while the other ranks' median is {_signed(median)} "
            f"({allowed})"
        )
        found.append(
            (
                rank,
                Finding(
                    measure.kind,
                    stats.phase,
                    stats.epoch,
                    int(value),
                    message,
                    slope=stats.slope if leak else None,
                    rule=RULE,
                ),
            )
        )
    return found

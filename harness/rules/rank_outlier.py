"""The cross-rank rule of a distributed run: one rank whose memory stands out from the others'.

A DDP leak often lives on one rank only (rank 0 gathering every batch, a hook added on one rank).
Each rank's own verdict may miss it when its budget is loose or unset; comparing the ranks does
not. :func:`judge_ranks` runs every registered rule marked ``across_ranks`` over a
:class:`RankContext` (the ranks' verdicts); ``rank_outlier`` is the built-in one.

``rank_outlier``, per ``(phase, epoch)`` that at least two ranks judged:

- growth (after warm-up, as the leak rule measures it: :mod:`harness.rules.fit`): a rank with
  an increasing trend (p < :data:`~harness.rules.loop.ALPHA`) whose growth exceeds the other
  ranks' median by more than the gap, and is more than twice that median, is a ``leak``
  finding naming the rank;
- peak rise: the same test on ``peak_rise`` (no trend needed) is a ``peak`` finding, unless
  that rank's growth stood out already (its peak is then the same memory).

The gap is ``max_growth`` (growth) or ``max_peak`` (peak), and :data:`DEFAULT_GAP` for one that
is off. Registered by :mod:`harness.rules` with ``option=None``: an ordinary, one-timeline judgement
calls it with a plain :class:`~harness.rules.context.Context`, and it judges nothing there.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from harness.core.units import format_rate, format_size
from harness.rules.context import CheckLog, scope
from harness.rules.loop import ALPHA
from harness.rules.registry import registered
from harness.verdict.model import Check, CheckStatus, Finding, Kind, PhaseStats, Verdict
from harness.verdict.options import Rules

RULE = "rank_outlier"
DEFAULT_GAP = 2**20
"""The gap a rank must stand out by when the rules set no budget for that measure (1 MiB)."""


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


@across_ranks
def rank_outlier(ctx: Any, option: Any = None) -> list[Finding]:
    """A rank whose growth or peak rise stands out from the other ranks' (see the module)."""
    if not isinstance(ctx, RankContext):
        return []
    if len(ctx.verdicts) < 2:
        ctx.check(RULE, "run", CheckStatus.SKIP, "one rank: nothing to compare")
        return []
    growth_gap = ctx.rules.max_growth or DEFAULT_GAP
    peak_gap = ctx.rules.max_peak or DEFAULT_GAP
    world = len(ctx.verdicts)
    worst: dict[tuple[int, str | None, Kind], Finding] = {}
    for (phase, epoch), by_rank in ctx.phases().items():
        where = scope(phase, epoch)
        if len(by_rank) < 2:
            ctx.check(RULE, where, CheckStatus.SKIP, "judged on one rank only")
            continue
        found = _stand_out(by_rank, "growth", growth_gap, Kind.LEAK, world, (phase, epoch))
        leaking = {rank for rank, _ in found}
        found += [
            (rank, finding)
            for rank, finding in _stand_out(
                by_rank, "peak_rise", peak_gap, Kind.PEAK, world, (phase, epoch)
            )
            if rank not in leaking  # a leaking rank's peak is its growth again
        ]
        shown = ", ".join(
            f"rank {r} {_signed(s.growth)} / {_signed(s.peak_rise)}" for r, s in by_rank.items()
        )
        details = f"growth / peak rise by rank: {shown}"
        if found:
            named = "; ".join(f.message for _, f in found)
            ctx.check(RULE, where, CheckStatus.FAIL, f"{named} ({details})", limit=growth_gap)
        else:
            ctx.check(RULE, where, CheckStatus.PASS, f"no rank stands out: {details}")
        for rank, finding in found:
            key = (rank, phase, finding.kind)
            if key not in worst or (finding.bytes or 0) > (worst[key].bytes or 0):
                worst[key] = finding
    return list(worst.values())


def _signed(value: float | None) -> str:
    return format_size(value, signed=True)


def _stand_out(
    by_rank: Mapping[int, PhaseStats],
    measure: str,
    gap: int,
    kind: Kind,
    world: int,
    key: tuple[str | None, int | None],
) -> list[tuple[int, Finding]]:
    """The ranks whose ``measure`` exceeds the other ranks' median by more than ``gap`` and by
    more than that median again (a leak needs its own increasing trend too)."""
    found = []
    phase, epoch = key
    for rank, stats in by_rank.items():
        value = getattr(stats, measure)
        others = [getattr(s, measure) for r, s in by_rank.items() if r != rank]
        others = [v for v in others if v is not None]
        if value is None or not others:
            continue
        median = max(0.0, float(statistics.median(others)))
        if not (value - median > gap and value > 2 * median):
            continue
        if kind == Kind.LEAK and not (stats.p_value is not None and stats.p_value < ALPHA):
            continue
        what = "grew" if kind == Kind.LEAK else "peaked"
        slope = f" ({format_rate(stats.slope)})" if kind == Kind.LEAK else ""
        found.append(
            (
                rank,
                Finding(
                    kind,
                    phase,
                    epoch,
                    int(value),
                    f"rank {rank} of {world} stands out: {phase or 'the run'} {what} "
                    f"{format_size(value, signed=True)}{slope} while the other ranks' median is "
                    f"{format_size(median, signed=True)} (gap allowed {format_size(gap)})",
                    slope=stats.slope if kind == Kind.LEAK else None,
                    rule=RULE,
                ),
            )
        )
    return found

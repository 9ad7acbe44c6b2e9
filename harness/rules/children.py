"""Rules on the memory of child processes (DataLoader workers, subprocesses), per ``(phase,
epoch)`` loop, judged like the main process's leak: the same trend test, re-check and warm-up.

**The series.** Each role (``worker 0``, ``python3 4242``) and, with two roles or more, all
children together are judged on their *new memory*: ``child_metric`` (``uss`` or ``pss``)
plus the change in the pages the process still shares. A page a forked worker copies from its
parent (copy-on-read) leaves its shared pages as it enters its private ones, so it adds
nothing; a page it allocates adds a page. Readings are those of the loop's per-batch label that
have a rollup (:mod:`harness.child_sampling`): the fit is exact on what was sampled.

**Restarts.** A series is cut where its process changes (a role's pid; for all children, the
set of live processes): each piece's first ``warmup`` batches are warm-up (a new worker's
start-up), and the pieces are joined end to end, so a restart or an exit is neither a drop nor
a rise.

``max_child_growth`` (P0 ``child-leak``): a significant trend (p < ``ALPHA``, at least
``MIN_TREND_POINTS`` readings after warm-up) whose growth exceeds the budget, unless a
collected reading of the same process after the loop is back within it.

``copy_on_read`` (``copy-on-read``): a role whose private memory grew by more than
``max_child_growth`` with a trend, at least half of it pages it had shared (see
:func:`harness.children.growth_kind`): a dataset of Python objects read by workers. A P2
warning, blocking when what one worker copied exceeds ``max_copy_on_read`` (off by default:
clean TFT workers copy about 1 MiB of their parent's pages per epoch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.child_sampling import parse_processes
from harness.children import growth_kind, lifetimes, role_metric
from harness.rules.context import Context, Fit, Group, rate
from harness.rules.loop import ALPHA, MIN_TREND_POINTS
from harness.rules.registry import register_rule
from harness.store import NONE
from harness.units import format_size
from harness.verdict import Finding, Kind, Outcome

ALL = "all children"
"""The name of the series of every child together."""


@dataclass(frozen=True)
class ChildSeries:
    """One role's (or all children's) judged readings in a loop: positions after warm-up, their
    batches, new memory joined across restarts (``offset``: what the last piece was moved by),
    the fit, the process at each reading (a pid; for all children, the live set's code), and
    ``private`` and ``copied``: bytes that became private, and how many were shared pages."""

    name: str
    metric: str
    judged: np.ndarray
    batches: np.ndarray
    values: np.ndarray
    offset: float
    fit: Fit | None
    processes: tuple[int | None, ...]
    private: int
    copied: int


def child_series(ctx: Context, group: Group) -> list[ChildSeries]:
    """The group's children series: each live role's, and all children's when there are two
    or more roles. Empty when children were not recorded, are not judged or none lived."""
    if not ctx.rules.children:
        return []
    cols = ctx.columns
    looped = np.asarray(group.looped, dtype=np.int64)
    looped = looped[cols.label[looped] == cols.strings.index(group.label)]
    roles = sorted({role for c in np.unique(cols.processes[looped]) for role in _live(ctx, c)})
    found = [_series(ctx, looped, role) for role in roles]
    if len(roles) > 1:
        found.append(_series(ctx, looped, ALL))
    return found


def _live(ctx: Context, code: int) -> dict[str, int]:
    """The live processes a ``processes`` code stands for, by role."""
    return parse_processes(ctx.columns.strings[int(code)])


def _shared(ctx: Context, role: str, at: np.ndarray) -> np.ndarray:
    """The pages ``role`` still shares at positions ``at`` (every live role's, for all
    children)."""
    cols = ctx.columns
    if role != ALL:
        return cols.values(role_metric("child_shared", role))[at]
    shared = np.zeros(len(at))
    codes = cols.processes[at]
    for code in np.unique(codes):
        where = codes == code
        for other in _live(ctx, code):
            shared[where] += cols.values(role_metric("child_shared", other))[at[where]]
    return shared


def _series(ctx: Context, looped: np.ndarray, role: str) -> ChildSeries:
    cols = ctx.columns
    kind = ctx.rules.child_metric
    metric = f"children_{kind}" if role == ALL else role_metric(f"child_{kind}", role)
    at = looped[cols.present(metric)[looped]]
    codes = cols.processes[at].tolist()
    processes = codes if role == ALL else [_live(ctx, c).get(role) for c in codes]
    shared = _shared(ctx, role, at)
    values = cols.values(metric)[at] + shared
    uss_metric = "children_uss" if role == ALL else role_metric("child_uss", role)
    private = cols.values(uss_metric)[at]
    batch = np.where(cols.batch[at] == NONE, 0, cols.batch[at])
    keep = np.zeros(len(at), dtype=bool)
    joined = values.copy()
    offset, last, grown, copied = 0.0, None, 0, 0
    for life in lifetimes(processes):
        if processes[life.start] is None:
            continue
        piece = np.arange(life.start, life.stop)
        piece = piece[batch[piece] >= batch[life.start] + ctx.rules.warmup]
        if not len(piece):
            continue
        keep[piece] = True
        offset = 0.0 if last is None else last - values[piece[0]]
        joined[piece] += offset
        last = joined[piece[-1]]
        growth = growth_kind(private[piece].tolist(), shared[piece].tolist())
        grown += max(0, round(growth.private))
        copied += round(growth.converted) if growth.kind == "copy-on-read" else 0
    return ChildSeries(
        role,
        metric,
        at[keep],
        batch[keep],
        joined[keep],
        offset,
        Fit.of(batch[keep], joined[keep]),
        tuple(p for p, k in zip(processes, keep, strict=True) if k),
        grown,
        copied,
    )


@register_rule("max_child_growth", scope="phase", option=None)
def child_leak(ctx: Context, group: Group, _: None) -> list[Finding]:
    limit = ctx.rules.size("max_child_growth")
    if limit is None:
        return []
    leaking = []
    judged = child_series(ctx, group)
    for series in judged:
        where = f"{group.scope}, {series.name}"
        fit = series.fit
        if fit is None or len(series.judged) < MIN_TREND_POINTS:
            details = (
                f"{len(series.judged)} readings after warm-up: too few for a trend "
                f"(need {MIN_TREND_POINTS})"
            )
            ctx.check("max_child_growth", where, "SKIP", details, None, limit)
            continue
        t = fit.trend
        summary = (
            f"new memory {format_size(fit.growth, signed=True)} over {fit.span:g} batches after "
            f"warm-up, {rate(t.slope)}, trend p={t.p:.2g}"
        )
        if not (t.p < ALPHA and fit.growth > limit):
            ctx.check("max_child_growth", where, "PASS", summary, fit.growth, limit)
            continue
        recheck = _recheck(ctx, group, series)
        if recheck is not None and recheck <= fit.baseline + limit:
            details = f"{summary}, but a collected reading is back within max_child_growth"
            ctx.check("max_child_growth", where, "PASS", details, fit.growth, limit)
            continue
        outcome = Outcome.UNCHECKED if recheck is None else Outcome.RETAINED
        ctx.check("max_child_growth", where, "FAIL", f"{summary}; {outcome}", fit.growth, limit)
        leaking.append((series, outcome))
    if not leaking:
        return []
    roles = [s for s, _ in leaking if s.name != ALL]
    named_first = [pair for pair in leaking if pair[0].name != ALL] or leaking
    worst, outcome = max(named_first, key=lambda pair: pair[0].fit.growth if pair[0].fit else 0)
    assert worst.fit is not None
    named = ", ".join(_growth(s) for s in roles)
    if not roles:  # only all of them together: name each one's share
        shares = ", ".join(_growth(s) for s in judged if s.name != ALL)
        named = f"{_growth(worst)} ({shares})"
    message = (
        f"child-leak in {group.scope}: {named} > max_child_growth "
        f"{ctx.rules.shown('max_child_growth')} of new memory (trend p={worst.fit.trend.p:.2g})"
    )
    evidence = tuple(ctx.evidence(int(i), worst.metric) for i in worst.judged[[0, -1]])
    return [
        Finding(
            Kind.CHILD_LEAK,
            group.phase,
            group.epoch,
            round(worst.fit.growth),
            message,
            worst.fit.trend.slope,
            evidence,
            outcome=outcome,
        )
    ]


def _growth(series: ChildSeries) -> str:
    """``worker 0 +3.5MiB (+32.0KiB/batch)``."""
    if series.fit is None:
        return f"{series.name} (too few readings)"
    growth = format_size(series.fit.growth, signed=True)
    return f"{series.name} {growth} ({rate(series.fit.trend.slope)})"


def _recheck(ctx: Context, group: Group, series: ChildSeries) -> float | None:
    """New memory at the group's last collected reading after the loop, joined as the series
    is, when the series' last process (or set of processes) was still alive then; else None."""
    cols = ctx.columns
    after = np.asarray(group.indices, dtype=np.int64)
    after = after[(after > series.judged[-1]) & cols.collected[after]]
    after = after[cols.present(series.metric)[after]]
    if not len(after):
        return None
    at = after[-1:]
    code = int(cols.processes[at[0]])
    alive = code if series.name == ALL else _live(ctx, code).get(series.name)
    if alive != series.processes[-1]:
        return None
    new = cols.values(series.metric)[at] + _shared(ctx, series.name, at)
    return float(new[0] + series.offset)


@register_rule("copy_on_read", scope="phase", option=None)
def copy_on_read(ctx: Context, group: Group, _: None) -> list[Finding]:
    limit = ctx.rules.size("max_child_growth")
    if limit is None:
        return []
    copying = [
        s
        for s in child_series(ctx, group)
        if s.name != ALL
        and s.copied > limit
        and 2 * s.copied >= s.private
        and s.fit is not None
        and _private_trend(ctx, s) < ALPHA
    ]
    if not copying:
        return []
    worst = max(copying, key=lambda s: s.copied)
    budget = ctx.rules.size("max_copy_on_read")
    over = budget is not None and worst.copied > budget
    named = ", ".join(f"{s.name} {format_size(s.copied)}" for s in copying)
    message = (
        f"copy-on-read in {group.scope}: workers copied their parent's pages as they read "
        f"them ({named}; new memory within max_child_growth "
        f"{ctx.rules.shown('max_child_growth')})"
    )
    if over:
        shown = ctx.rules.shown("max_copy_on_read")
        message += f"; {format_size(worst.copied)} > max_copy_on_read {shown}"
    private = role_metric("child_uss", worst.name)
    evidence = tuple(ctx.evidence(int(i), private) for i in worst.judged[[0, -1]])
    return [
        Finding(
            Kind.COPY_ON_READ,
            group.phase,
            group.epoch,
            worst.copied,
            message,
            None,
            evidence,
            over_budget=over,
        )
    ]


def _private_trend(ctx: Context, series: ChildSeries) -> float:
    """The p-value of the rise of the role's private memory over its judged readings."""
    uss = ctx.columns.values(role_metric("child_uss", series.name))[series.judged]
    fit = Fit.of(series.batches, uss)
    return fit.trend.p if fit is not None else 1.0

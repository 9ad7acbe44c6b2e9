"""Rules on the memory of child processes (DataLoader workers, subprocesses), per ``(phase,
epoch)`` loop, judged like the main process's leak: the same trend test, re-check and warm-up.

**The measure.** Each role (``worker 0``, ``python3 4242``) is judged on its *live heap* where
the child publishes one (:mod:`harness._measure.heap_board`: DataLoader workers under every start
method, children forked by Python), read inside it as the main process's is, on the readings that
were fresh at a per-batch checkpoint: a reading is never counted for batches it did not see. A child
that publishes none is judged on its ``anon``, read from outside at every checkpoint. With two
roles or more, all children together are judged on ``children_heap`` (each one's latest live
heap, or its ``anon``). ``child_metric="anon"`` judges every child from outside. RSS-side
memory keeps what an allocator holds after a free: a clean worker's grows by MiBs, its live heap
by KiBs.

**Restarts.** A series is cut where its process changes (a role's pid; for all children, the
set of live processes): each piece's first ``warmup`` batches are warm-up (a new worker's
start-up), and the pieces are joined end to end, so a restart or an exit is neither a drop nor
a rise.

**The budget.** ``max_child_growth``, or ``max_growth`` when that is not set: a worker may grow
what the loop may (P0 ``child-leak``): a significant trend (p < ``ALPHA``, at least
``MIN_TREND_POINTS`` readings after warm-up) whose growth exceeds the budget, unless a
collected reading of the same process after the loop is back within it. All children together
may grow what each may, times the number of roles in the loop: a budget for the sum alone
would fail clean loops by their worker count (8 clean TFT workers, 18 KiB each in their first
epoch, sum to 165 KiB), while a small leak in every worker still adds up to a significant
trend in the sum.

``copy_on_read`` (``copy-on-read``): a role whose private memory (``smaps_rollup``, read at
phase edges, collected checkpoints and a process's first checkpoint) grew by more than the
budget over one process's life in the loop, at least half of it pages it had shared (see
:func:`growth_kind`): a dataset of Python objects read by workers. A P2 warning, blocking when
what one worker copied exceeds ``max_copy_on_read`` (off by default: clean TFT workers copy
about 1 MiB of their parent's pages per epoch).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from harness._core.errors import BadArgument
from harness._core.units import format_size
from harness._measure.children import parse_processes, role_metric
from harness._rules.context import Context, Fit, Group, rate
from harness._rules.loop import ALPHA, MIN_TREND_POINTS
from harness._rules.measures import OUTSIDE_FLOOR
from harness._rules.registry import register_rule
from harness._timeline.store import NONE
from harness._verdict.model import CheckStatus, Finding, Kind, Outcome

ALL = "all children"
"""The name of the series of every child together."""
UNEXPLAINED = "anon outside what leakgate reads"
MEASURES = {
    "child_heap": "live heap",
    "child_anon": "anon",
    "children_heap": "live heap",
    "child_outside": UNEXPLAINED,
}
"""What each judged metric is called in a check and the report."""


@dataclass(frozen=True)
class ChildSeries:
    """One role's (or all children's) judged readings in a loop: positions after warm-up, their
    batches, the readings joined across restarts (``offset``: what the last piece was moved by),
    the fit, and the process at each reading (a pid; for all children, the live set's code)."""

    name: str
    metric: str
    judged: np.ndarray
    batches: np.ndarray
    values: np.ndarray
    offset: float
    fit: Fit | None
    processes: tuple[int | None, ...]

    @property
    def measure(self) -> str:
        """``live heap`` or ``anon``: what the series was judged on."""
        return MEASURES.get(self.metric.partition(":")[0], "anon")


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
    if ctx.rules.child_metric == "heap":  # and what no counter explains, where it was read
        for role in roles:
            outside = role_metric("child_outside", role)
            settled = _series(ctx, looped, role, outside, settled=True)
            if len(settled.judged):  # none in a process's first loop
                found.append(settled)
    return found


def _alive_before(ctx: Context, at: int) -> set[int]:
    """The pids of the processes read before position ``at``. A process's first loop is its
    start-up for what no counter explains: it faults back in the pages its parent had given
    back and left it (a clean TFT worker's moved by 1.1 MiB in its first epoch)."""
    codes = np.unique(ctx.columns.processes[:at])
    return {pid for code in codes.tolist() for pid in _live(ctx, code).values()}


def _live(ctx: Context, code: int) -> dict[str, int]:
    """The live processes a ``processes`` code stands for, by role."""
    return parse_processes(ctx.columns.strings[int(code)])


def _metric(ctx: Context, looped: np.ndarray, role: str) -> str:
    """What ``role`` is judged on in this loop: its live heap where it was read, else anon."""
    cols = ctx.columns
    inside = ctx.rules.child_metric == "heap"
    if role == ALL:
        heap = inside and cols.present("children_heap")[looped].any()
        return "children_heap" if heap else "children_anon"
    heap = role_metric("child_heap", role)
    return heap if inside and cols.present(heap)[looped].any() else role_metric("child_anon", role)


def _series(
    ctx: Context, looped: np.ndarray, role: str, metric: str | None = None, *, settled: bool = False
) -> ChildSeries:
    """``role``'s series in ``metric`` (its judged measure by default) over the loop; with
    ``settled``, only over the lives of processes already read before the loop began."""
    cols = ctx.columns
    metric = metric or _metric(ctx, looped, role)
    at = looped[cols.present(metric)[looped]]
    codes = cols.processes[at].tolist()
    processes = codes if role == ALL else [_live(ctx, c).get(role) for c in codes]
    values = cols.values(metric)[at]
    batch = np.where(cols.batch[at] == NONE, 0, cols.batch[at])
    keep = np.zeros(len(at), dtype=bool)
    joined = values.copy()
    offset, last = 0.0, None
    before = _alive_before(ctx, int(looped[0])) if settled and len(looped) else None
    for life in lifetimes(processes):
        if processes[life.start] is None:
            continue
        if before is not None and processes[life.start] not in before:
            continue
        piece = np.arange(life.start, life.stop)
        piece = piece[batch[piece] >= batch[life.start] + ctx.rules.warmup]
        if not len(piece):
            continue
        keep[piece] = True
        offset = 0.0 if last is None else last - values[piece[0]]
        joined[piece] += offset
        last = joined[piece[-1]]
    return ChildSeries(
        role,
        metric,
        at[keep],
        batch[keep],
        joined[keep],
        offset,
        Fit.of(batch[keep], joined[keep]),
        tuple(p for p, k in zip(processes, keep, strict=True) if k),
    )


@register_rule("max_child_growth", scope="phase", option=None)
def child_leak(ctx: Context, group: Group, _: None) -> list[Finding]:
    name = ctx.rules.budget("max_child_growth")
    limit = ctx.rules.size(name) if name else None
    if name is None or limit is None:
        return []
    leaking = []
    judged = child_series(ctx, group)
    roles = len({s.name for s in judged if s.name != ALL})
    for series in judged:
        where = f"{group.scope}, {series.name}"
        if series.measure == UNEXPLAINED:  # beside the live heap's check of the same role
            where += " (outside)"
        budget = limit * roles if series.name == ALL else limit
        if series.measure == UNEXPLAINED:  # read by the page: judged from its floor up
            budget = max(budget, OUTSIDE_FLOOR)
        fit = series.fit
        if fit is None or len(series.judged) < MIN_TREND_POINTS:
            details = (
                f"{len(series.judged)} {series.measure} readings after warm-up: too few for a "
                f"trend (need {MIN_TREND_POINTS})"
            )
            ctx.check("max_child_growth", where, CheckStatus.SKIP, details, None, budget)
            continue
        t = fit.trend
        summary = (
            f"{series.measure} {format_size(fit.growth, signed=True)} over {fit.span:g} batches "
            f"after warm-up, {rate(t.slope)}, trend p={t.p:.2g}"
        )
        if not (t.p < ALPHA and fit.growth > budget):
            ctx.check("max_child_growth", where, CheckStatus.PASS, summary, fit.growth, budget)
            continue
        other = _other_bound(ctx, group, series)
        if other is not None and other <= budget:
            details = (
                f"{summary}, but its anon less its live heap grew "
                f"{format_size(other, signed=True)}: a heap refilling pages, not memory outside it"
            )
            ctx.check("max_child_growth", where, CheckStatus.PASS, details, other, budget)
            continue
        recheck = _recheck(ctx, group, series)
        if recheck is not None and recheck <= fit.baseline + budget:
            details = f"{summary}, but a collected reading is back within {name}"
            ctx.check("max_child_growth", where, CheckStatus.PASS, details, fit.growth, budget)
            continue
        outcome = Outcome.UNCHECKED if recheck is None else Outcome.RETAINED
        ctx.check(
            "max_child_growth", where, CheckStatus.FAIL, f"{summary}; {outcome}", fit.growth, budget
        )
        leaking.append((series, outcome))
    if not leaking:
        return []
    over = [s for s, _ in leaking if s.name != ALL]
    named_first = [pair for pair in leaking if pair[0].name != ALL] or leaking
    worst, outcome = max(named_first, key=lambda pair: pair[0].fit.growth if pair[0].fit else 0)
    assert worst.fit is not None
    named = ", ".join(_growth(s) for s in over)
    shown = f"{name} {ctx.rules.shown(name)}"
    if not over:  # only all of them together: name the share of each one that grew
        grew = [s for s in judged if s.name != ALL and s.fit is not None and s.fit.growth > 0]
        shares = ", ".join(_growth(s) for s in grew)
        named = f"{_growth(worst)} ({shares})"
        shown = f"{roles} x {shown}"
    message = (
        f"child-leak in {group.scope}: {named} > {shown} "
        f"of {worst.measure} (trend p={worst.fit.trend.p:.2g})"
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


def _other_bound(ctx: Context, group: Group, series: ChildSeries) -> float | None:
    """For a role's memory outside what leakgate reads, the growth of its other bound (its anon
    less its live heap, :attr:`~harness._rules.measures.Measure.bound`: a heap refilling pages
    its parent had given back moves the first, never this one), else None."""
    if series.measure != UNEXPLAINED:
        return None
    looped = np.asarray(group.looped, dtype=np.int64)
    looped = looped[ctx.columns.label[looped] == ctx.columns.strings.index(group.label)]
    name = role_metric("child_beyond", series.name)
    beyond = _series(ctx, looped, series.name, name, settled=True)
    return beyond.fit.growth if beyond.fit is not None else None


def _growth(series: ChildSeries) -> str:
    """``worker 0 +3.5MiB (+32.0KiB/batch)``."""
    if series.fit is None:
        return f"{series.name} (too few readings)"
    growth = format_size(series.fit.growth, signed=True)
    return f"{series.name} {growth} ({rate(series.fit.trend.slope)})"


def _recheck(ctx: Context, group: Group, series: ChildSeries) -> float | None:
    """The reading at the group's last collected checkpoint after the loop, joined as the
    series is, when the series' last process (or set of processes) was still alive then; else
    None."""
    cols = ctx.columns
    after = np.asarray(group.indices, dtype=np.int64)
    after = after[(after > series.judged[-1]) & cols.collected[after]]
    after = after[cols.present(series.metric)[after]]
    if not len(after):
        return None
    at = int(after[-1])
    code = int(cols.processes[at])
    alive = code if series.name == ALL else _live(ctx, code).get(series.name)
    if alive != series.processes[-1]:
        return None
    return float(cols.values(series.metric)[at] + series.offset)


@dataclass(frozen=True)
class Copies:
    """What one role's processes made private in a loop (``private``) and how many of those
    bytes were pages they had shared (``copied``), from their first and last rollups; the
    positions of those two readings."""

    role: str
    private: int
    copied: int
    first: int
    last: int


def copies(ctx: Context, group: Group) -> list[Copies]:
    """Each role's private growth in the group, over each of its processes' lives."""
    cols = ctx.columns
    at = np.asarray(group.indices, dtype=np.int64)
    roles = sorted({role for c in np.unique(cols.processes[at]) for role in _live(ctx, c)})
    found = []
    for role in roles:
        uss_metric = role_metric("child_uss", role)
        read = at[cols.present(uss_metric)[at]]
        if len(read) < 2:
            continue
        pids = [_live(ctx, c).get(role) for c in cols.processes[read].tolist()]
        uss = cols.values(uss_metric)[read]
        shared = cols.values(role_metric("child_shared", role))[read]
        private = copied = 0
        for life in lifetimes(pids):
            if pids[life.start] is None or len(life) < 2:
                continue
            ends = [life.start, life.stop - 1]
            growth = growth_kind(uss[ends].tolist(), shared[ends].tolist())
            private += max(0, round(growth.private))
            copied += round(growth.converted) if growth.kind == "copy-on-read" else 0
        found.append(Copies(role, private, copied, int(read[0]), int(read[-1])))
    return found


@register_rule("copy_on_read", scope="phase", option=None)
def copy_on_read(ctx: Context, group: Group, _: None) -> list[Finding]:
    name = ctx.rules.budget("max_child_growth")
    limit = ctx.rules.size(name) if name else None
    if not ctx.rules.children or name is None or limit is None:
        return []
    copying = [c for c in copies(ctx, group) if c.copied > limit and 2 * c.copied >= c.private]
    if not copying:
        return []
    worst = max(copying, key=lambda c: c.copied)
    limit_copies = ctx.rules.max_copy_on_read
    over = limit_copies is not None and worst.copied > limit_copies
    named = ", ".join(f"{c.role} {format_size(c.copied)}" for c in copying)
    message = (
        f"copy-on-read in {group.scope}: workers copied their parent's pages as they read "
        f"them ({named}; their live heap is judged on its own against {name} "
        f"{ctx.rules.shown(name)})"
    )
    if over:
        shown = ctx.rules.shown("max_copy_on_read")
        message += f"; {format_size(worst.copied)} > max_copy_on_read {shown}"
    private = role_metric("child_uss", worst.role)
    evidence = (ctx.evidence(worst.first, private), ctx.evidence(worst.last, private))
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


def lifetimes(pids: Iterable[int | None]) -> list[range]:
    """The stretches of a role's pid series (``None`` where absent) that one process lived:
    the first readings of each are that process's start-up, not growth."""
    stretches: list[range] = []
    start, current = 0, None
    for index, pid in enumerate([*pids, None]):
        if pid != current:
            if current is not None:
                stretches.append(range(start, index))
            start, current = index, pid
    return stretches


@dataclass(frozen=True)
class Growth:
    """How a worker's private memory grew over one lifetime, in bytes.

    ``kind`` is ``copy-on-read`` when at least half of the private growth was pages the worker
    had shared and then wrote (a forked worker's reference counts touching the parent's Python
    objects: the fix is storage without per-item objects, numpy, pyarrow, tensors), else
    ``private`` (memory the worker allocated itself: a cache, a leak)."""

    kind: Literal["copy-on-read", "private"]
    private: int
    converted: int


def growth_kind(uss: Sequence[int], shared: Sequence[int]) -> Growth:
    """Copy-on-read or private growth, from one lifetime of a role's ``child_uss`` and
    ``child_shared`` series (same length, at least one reading). It names the kind of any
    growth, however small: whether the growth matters is the rules' call.

    A page a forked worker writes leaves its ``Shared_*`` and enters its ``Private_*`` sums,
    so copy-on-read shows as shared memory falling as private memory rises; a cache's new
    pages were never shared. (The parent's PSS rises as it loses sharers, so the worker's own
    pages tell the two apart without the parent's.)"""
    if len(uss) != len(shared) or not uss:
        raise BadArgument("growth_kind needs two series of the same, non-zero length")
    private = uss[-1] - uss[0]
    converted = max(0, shared[0] - shared[-1])
    copied = private > 0 and 2 * converted >= private
    return Growth("copy-on-read" if copied else "private", private, converted)

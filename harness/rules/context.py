"""What every rule reads: the samples, the rules, and one statistics pass per ``(phase, epoch)``.

A group's *series* is its most frequent per-batch label (events left out), ordered by batch,
in one metric: ``rules.metric`` if every sample of the series has it, else ``rss``. Its *fit*
(after ``warmup`` batches) and *peak* are computed once, here, and read by the rules.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from harness import labels
from harness.sample import Sample
from harness.stats import Trend, edge_window, robust_delta, trend
from harness.units import format_size
from harness.verdict import Check, CheckStatus, Evidence, Rules

FALLBACK_METRIC = "rss"
Key = tuple[str | None, int | None]


class Peak(NamedTuple):
    """A group's highest reading: where (``at``, in ``metric``), and its ``rise`` above the
    reading of ``base`` at ``start``."""

    at: int
    metric: str
    start: int
    base: str
    value: int
    rise: int


@dataclass(frozen=True)
class Fit:
    """A series after warm-up: its trend, growth (the larger of slope x span and the robust
    delta), batch span and starting level (median of the first edge window)."""

    trend: Trend
    growth: float
    span: float
    baseline: float

    @classmethod
    def of(cls, x: list[int], y: list[int]) -> Fit | None:
        if len(x) < 2:
            return None
        t = trend(x, y)
        span = float(x[-1] - x[0])
        baseline = float(np.median(y[: edge_window(len(y))]))
        return cls(t, max(t.slope * span, robust_delta(y)), span, baseline)


@dataclass
class Group:
    """One ``(phase, epoch)`` with per-batch samples: positions of all its samples, its series,
    the judged part of it (after warm-up), the metric, the fit and the peak."""

    key: Key
    indices: list[int]
    label: str
    looped: list[int]
    metric: str | None
    series: list[int]
    judged: list[int] = field(default_factory=list)
    start: int | None = None
    end: int | None = None
    fit: Fit | None = None
    peak: Peak | None = None

    @property
    def phase(self) -> str | None:
        return self.key[0]

    @property
    def epoch(self) -> int | None:
        return self.key[1]

    @property
    def scope(self) -> str:
        return scope(*self.key)


class Context:
    """The judged samples and rules, the groups' statistics, and the checks recorded so far."""

    def __init__(self, samples: list[Sample], rules: Rules) -> None:
        self.samples = samples
        self.rules = rules
        self.checks: list[Check] = []
        self.loop_positions = [i for i, s in enumerate(samples) if labels.in_loop(s)]
        self.groups = self._groups()

    def check(
        self,
        rule: str,
        scope: str,
        status: CheckStatus | str,
        details: str,
        measured: float | None = None,
        limit: int | None = None,
    ) -> Check:
        """Record one rule's outcome on one scope."""
        made = Check(rule, scope, CheckStatus(status), details, measured, limit)
        self.checks.append(made)
        return made

    def phases_seen(self) -> list[str]:
        """The phases that have per-batch samples, in timeline order."""
        return list(dict.fromkeys(str(g.phase) for g in self.groups if g.phase is not None))

    # -- the statistics pass ------------------------------------------------------------------

    def _groups(self) -> list[Group]:
        by_key: dict[Key, list[int]] = {}
        for i, s in enumerate(self.samples):
            by_key.setdefault((s.phase, s.epoch), []).append(i)
        groups = []
        for key, indices in by_key.items():
            looped = [i for i in indices if labels.in_loop(self.samples[i])]
            if looped:
                groups.append(self._group(key, indices, looped))
        return groups

    def _group(self, key: Key, indices: list[int], looped: list[int]) -> Group:
        label = Counter(self.samples[i].label for i in looped).most_common(1)[0][0]
        series = [i for i in looped if self.samples[i].label == label]
        metric = self._choose_metric(series)
        series = sorted(
            (i for i in series if metric and self.samples[i].get(metric) is not None),
            key=lambda i: self.samples[i].batch or 0,
        )
        group = Group(key, indices, label, looped, metric, series)
        if not series or metric is None:
            return group
        first_batch = self.samples[series[0]].batch or 0
        group.judged = [
            i for i in series if (self.samples[i].batch or 0) >= first_batch + self.rules.warmup
        ]
        readings = [i for i in indices if self.samples[i].get(metric) is not None]
        group.start, group.end = readings[0], readings[-1]
        group.fit = Fit.of(*self.values(group.judged, metric))
        group.peak = self._peak(indices, group.start, metric)
        return group

    def _choose_metric(self, series: list[int]) -> str | None:
        """The rule's metric if every sample has it, else rss if every sample has it, else the
        one read most often (samples without it are then left out)."""
        candidates = list(dict.fromkeys((self.rules.metric, FALLBACK_METRIC)))
        counts = {m: sum(self.samples[i].get(m) is not None for i in series) for m in candidates}
        for m in candidates:
            if series and counts[m] == len(series):
                return m
        best = max(candidates, key=lambda m: counts[m])
        return best if counts[best] else None

    def _peak(self, indices: list[int], start: int, metric: str) -> Peak:
        """The group's highest reading and its rise above the reading at ``start``. A sample's
        ``peak`` (high-water mark since the previous checkpoint) is read against the metric it
        is the mark of: allocated on CUDA, rss on CPU. The first sample's own ``peak`` covers
        time before the phase and is not used."""
        first = self.samples[start]
        first_value = first.get(metric) or 0
        best = Peak(start, metric, start, metric, first_value, 0)
        for i in indices[indices.index(start) + 1 :]:
            s = self.samples[i]
            base = peak_base(s, metric)
            high, base_value = s.get("peak"), first.get(base)
            if high is not None and base_value is not None:
                peak = Peak(i, "peak", start, base, high, high - base_value)
            elif (value := s.get(metric)) is not None:
                peak = Peak(i, metric, start, metric, value, value - first_value)
            else:
                continue
            if peak.rise > best.rise:
                best = peak
        return best

    # -- helpers for rules --------------------------------------------------------------------

    def values(self, positions: list[int], metric: str) -> tuple[list[int], list[int]]:
        """Batch indices and readings of ``metric`` at ``positions``."""
        return (
            [self.samples[i].batch or 0 for i in positions],
            [self.samples[i].get(metric) or 0 for i in positions],
        )

    def value(self, i: int, metric: str) -> int:
        """The reading of ``metric`` at position ``i`` (0 when absent: callers check first)."""
        return self.samples[i].get(metric) or 0

    def pair_metric(self, a: int, b: int) -> str | None:
        """The first of the rule's metric and rss that both positions have."""
        for m in dict.fromkeys((self.rules.metric, FALLBACK_METRIC)):
            if self.samples[a].get(m) is not None and self.samples[b].get(m) is not None:
                return m
        return None

    def evidence(self, i: int, metric: str | None) -> Evidence:
        s = self.samples[i]
        value = s.get(metric) if metric else None
        return Evidence(i, s.label, s.phase, s.epoch, s.batch, metric, value, s.collected)


def peak_base(s: Sample, metric: str) -> str:
    """The metric whose high-water mark ``peak`` is: allocated on CUDA, rss on CPU."""
    if s.get("reserved") is not None:
        return "allocated"
    return FALLBACK_METRIC if s.get(FALLBACK_METRIC) is not None else metric


def scope(phase: str | None, epoch: int | None) -> str:
    name = phase if phase is not None else "(no phase)"
    return name if epoch is None else f"{name} epoch {epoch}"


def where(s: Sample) -> str:
    """``VALIDATION_BATCH epoch 0 batch 12``."""
    parts = [s.label]
    if s.epoch is not None:
        parts.append(f"epoch {s.epoch}")
    if s.batch is not None:
        parts.append(f"batch {s.batch}")
    return " ".join(parts)


def rate(slope: float) -> str:
    """Bytes per batch, in the largest binary unit that keeps the number >= 1."""
    return f"{format_size(slope, signed=True)}/batch"

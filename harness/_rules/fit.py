"""A loop's series fitted, per batch: how much it grew after warm-up, where the growth started,
at what rate, and whether it stopped.

The readings after warm-up sit at batches ``x`` (strictly ascending), each standing for the
batches around it (a loop read on a stride weighs as if every batch were read: see
:mod:`harness._core.stats`). A continuous line of three pieces
(:func:`~harness._core.stats.broken_line`) is fitted to them. The growth is its rise from the first
judged batch to the loop's last batch.

- The growth *starts* (``onset``) at a knot where every piece before it is flat (rising at
  most :data:`FLAT_PIECE` as fast as the line rises after it, on average) and the line rises
  after it: ``leak from batch 400`` (the later knot where both hold). The ``rate`` is then
  the rise after the onset per batch after it; without an onset it is the trend's slope.
- The growth *stopped* (``stopped``, a plateau: a bounded cache) at the batch from which the
  series stays within :data:`FLAT_PIECE` of the growth of its last level
  (:func:`~harness._core.stats.settled`), when it stays there for at least :data:`PLATEAU` batches
  and for more batches than the growth took from the first judged batch (it ended in the
  first half of the loop).
- The trend is tested (Mann-Kendall) on the readings of the stride's schedule
  (:data:`~harness._measure.sample.STRIDE`: every batch of the first 32, then every 16th, whether or
  not more were read), and on the series per batch cut into as many equal spans of batches as
  those readings, each span its median; so the same loop is tested on the same evidence
  however it was read, a cache filling in the dense first readings and a leak in the sparse
  later ones alike. Where growth starts late, both tests are also run from as many batches
  before the onset as there are after it (where :data:`TESTED` readings are), so that flat
  batches long before it do not dilute it. The smallest p counts, multiplied by the number of
  tests. The slope is the whole loop's spans' Theil-Sen slope.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from harness._core.stats import Broken, Trend, broken_line, per_batch, settled, trend, trend_test
from harness._measure.sample import STRIDE

FLAT_PIECE = 0.1
"""Flat: rising at most this share as fast as after an onset; settled: within this share of
the growth of the last level."""
PLATEAU = 16
"""The fewest batches a loop must stay flat at its end for its growth to have stopped."""
TESTED = 6
"""The fewest readings around an onset for the trend to be tested there alone."""


@dataclass(frozen=True)
class Fit:
    """A series after warm-up: its trend, growth, batch span (first judged batch to the loop's
    last), starting level (``baseline``, the line at the first judged batch), where growth
    started (``onset``) and stopped (``stopped``), the batch, or None, and the ``rate`` it grows
    at (bytes a batch, after the onset). Where batch numbers do not ascend (``in_order`` false)
    every batch figure counts the loop's checkpoints instead."""

    trend: Trend
    growth: float
    span: float
    baseline: float
    line: Broken
    onset: float | None = None
    stopped: float | None = None
    rate: float = 0.0
    in_order: bool = True

    @property
    def flat(self) -> float:
        """The batches the loop stayed flat for after its growth stopped (0 when it did not)."""
        return 0.0 if self.stopped is None else self.line.x[0] + self.span - self.stopped

    @property
    def since(self) -> str:
        """`` from batch 400`` where the growth starts after the first judged batch, else
        nothing."""
        if self.onset is None:
            return ""
        return f" from {'batch' if self.in_order else 'the loop checkpoint'} {self.onset:.0f}"

    @classmethod
    def of(
        cls,
        x: Sequence[float] | np.ndarray,
        y: Sequence[float] | np.ndarray,
        *,
        end: float | None = None,
        in_order: bool = True,
        runs: Sequence[int] | np.ndarray | None = None,
    ) -> Fit | None:
        """Fit readings ``y`` at batches ``x`` of a loop whose last batch is ``end`` (the last
        reading's by default; a loop read on a stride may end after it). ``x`` counts the loop's
        checkpoints where ``in_order`` is false; batches that do not strictly ascend are
        replaced by the readings' order. ``runs`` numbers each reading's batch in its loop
        (from 0): the trend is tested on those the stride reads (all readings without it)."""
        if len(x) < 2:
            return None
        xs, ys = np.asarray(x), np.asarray(y)  # whole numbers stay so: trend reduces first
        if not bool((xs[1:] > xs[:-1]).all()):
            xs, end, in_order = np.arange(len(xs)), None, False
        first, last = float(xs[0]), float(xs[-1])
        end = last if end is None else max(float(end), last)
        ys = ys - ys[0]  # exact for whole numbers: a constant added changes no figure
        gx, gy = per_batch(xs, ys)
        line = broken_line(gx, gy, end=end)
        onset = stopped = None
        slopes = [
            (line.y[k + 1] - line.y[k]) / max(line.x[k + 1] - line.x[k], 1.0) for k in range(3)
        ]
        for k in (2, 1):  # the later knot first: every piece before it flat, rising after it
            after = (line.y[3] - line.y[k]) / max(end - line.x[k], 1.0)
            if after > 0 and all(abs(v) <= FLAT_PIECE * after for v in slopes[:k]):
                onset = line.x[k]
                break
        growth = line.y[3] - line.y[0]
        if growth > 0:
            ended = settled(gx, gy, line.y[3], FLAT_PIECE * growth)
            if end - ended >= PLATEAU and end - ended > ended - first:
                stopped = ended
        tested = np.ones(len(xs), dtype=bool) if runs is None else STRIDE.reads(np.asarray(runs))
        whole = trend(xs, ys, spans=int(np.count_nonzero(tested)))  # the line, and a test
        tests: list[tuple[np.ndarray, int | None]] = [(tested, None)]  # the stride's readings
        if onset is not None:  # and the spans and readings near the onset
            near = xs >= 2 * onset - end
            if np.count_nonzero(tested & near) >= TESTED:
                tests += [(near, int(np.count_nonzero(tested & near))), (tested & near, None)]
        p = min([whole.p, *(trend_test(xs[m], ys[m], spans=spans)[2] for m, spans in tests)])
        t = replace(whole, p=min(1.0, (1 + len(tests)) * p))  # Bonferroni's way
        rate = t.slope
        if onset is not None:
            rate = (line.y[3] - line.at(onset)) / max(end - onset, 1.0)
        baseline = float(np.asarray(y)[0]) + line.y[0]
        return cls(t, growth, end - first, baseline, line, onset, stopped, rate, in_order)

"""Memory over commits: a series' runs reduced to one value a commit, its noise, the creep
rule and the steps.

A series' runs are grouped by commit, in the order commits were first run; a commit's value
is the median of its runs. A run without a commit (appended outside a repository) is a point
of its own, in the order runs were appended. The noise is the runs' own spread: the median of
the robust standard deviations of each commit's runs where commits were run more than once,
else that of the steps from one commit to the next (divided by √2: a step holds two runs'
noise), which a steady creep or a single step does not inflate.

**Creep** (:func:`creep`): over the last ``runs`` comparable runs (one test, one machine
fingerprint, one metric), a Mann-Kendall test of the commits' values for an increasing trend
(one-sided ``p`` below :data:`CREEP_ALPHA`), whose Theil-Sen rise over the window exceeds the limit
(a fraction of the level the line starts at), the noise floor in bytes and
:data:`NOISE_SIGMAS` times the noise (a step that large is a creep too). It starts where the
best fitting flat-then-rising line or step does (:func:`onset`). Fewer than
:data:`MIN_RUNS` runs, or than :data:`MIN_POINTS` points, decide nothing.

**Steps** (:func:`steps`): binary segmentation of the commits' values, each split where the
means on its sides differ most (weighed by their lengths, as a least-squares step fits); it
stands where the medians on its sides differ by more than :data:`STEP` of the level, the noise
floor and :data:`NOISE_SIGMAS` noise, each side at least two commits.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from harness._core.errors import BadArgument
from harness._core.stats import MAD_TO_SIGMA, NOISE_SIGMAS, trend
from harness._core.wording import plural

CREEP_ALPHA = 0.01
"""The Mann-Kendall test's one-sided level: at most 1% false alarms on a flat series."""
MIN_RUNS = 5
MIN_POINTS = 3
"""Commits (or runs without one) a trend needs."""
STEP = 0.05
DEFAULT_CREEP = "10%/20"


@dataclass(frozen=True)
class CreepLimit:
    """``--max-creep``: a rise of more than ``fraction`` over the last ``runs`` runs."""

    fraction: float
    runs: int

    @classmethod
    def parse(cls, given: str) -> CreepLimit:
        """``10%/20`` (or ``10/20``): 10% over 20 runs. ``BadArgument`` otherwise."""
        percent, _, runs = given.partition("/")
        try:
            fraction = float(percent.strip().removesuffix("%")) / 100
            count = int(runs)
        except ValueError:
            raise BadArgument(f"expected PCT/RUNS like 10%/20, got {given!r}") from None
        if not (0 < fraction < math.inf) or count < MIN_RUNS:
            raise BadArgument(f"expected a percentage > 0 and at least {MIN_RUNS} runs: {given!r}")
        return cls(fraction, count)

    def __str__(self) -> str:
        return f"{self.fraction * 100:g}%/{self.runs}"


@dataclass(frozen=True)
class Commits:
    """A series' runs as one value a point, a commit or a run without one: the points in order,
    each one's commit (None for a run without one), its value, the noise, the runs weighed, and
    the time of each point's first run (microseconds since the epoch) where known."""

    names: list[str | None]
    values: np.ndarray
    noise: float
    runs: int
    times: list[int | None] = field(default_factory=list)

    def kinds(self) -> str:
        """The points, as ``20 commits``, ``20 runs without a commit`` or ``12 commits and 8
        runs without one``."""
        loose = sum(name is None for name in self.names)
        commits = plural(len(self.names) - loose, "commit")
        if not loose:
            return commits
        runs = f"{plural(loose, 'run')} without "
        return runs + "a commit" if loose == len(self.names) else f"{commits} and {runs}one"


def by_commit(
    commits: Sequence[str | None], values: np.ndarray, times: np.ndarray | None = None
) -> Commits:
    """The runs (``values``, NaN for unknown, dropped) grouped by commit in the order each
    commit was first run, each the median of its runs, and their noise; a run without a commit
    is a point of its own. ``times``: each run's, to name the points that have no commit."""
    known = ~np.isnan(values)
    points: dict[object, list[float]] = {}
    names: list[str | None] = []
    firsts: list[int | None] = []
    for i in np.flatnonzero(known).tolist():
        commit = commits[i]
        key = commit if commit is not None else ("run", i)
        if key not in points:
            points[key] = []
            names.append(commit)
            firsts.append(None if times is None else int(times[i]))
        points[key].append(float(values[i]))
    medians = np.array([float(np.median(v)) for v in points.values()])
    spreads = [_sigma(np.array(v)) for v in points.values() if len(v) > 1]
    if spreads:
        noise = float(np.median(spreads))
    elif len(medians) > 2:
        noise = _sigma(np.diff(medians)) / math.sqrt(2)
    else:
        noise = 0.0
    return Commits(names, medians, noise, int(known.sum()), firsts)


def point_text(commit: str | None, time: int | None, width: int) -> str:
    """A point as a person reads it: its commit's first ``width`` characters, or for a run
    without a commit, its time."""
    if commit is not None:
        return commit[:width]
    if time is None:
        return "a run without a commit"
    at = datetime.datetime.fromtimestamp(time / 1e6, datetime.UTC)
    return f"the run of {at:%Y-%m-%d %H:%M:%S} UTC (no commit)"


def _sigma(values: np.ndarray) -> float:
    return MAD_TO_SIGMA * float(np.median(np.abs(values - np.median(values))))


@dataclass(frozen=True)
class Creep:
    """The creep rule's answer for one series' value: ``crept`` (None: not enough history),
    the trend line's rise over the window (bytes, and as a fraction of where it starts), the
    test's p, the commit the rise started at, how many runs and commits were weighed, and the
    values of the window's first and last commits (what a person compares). ``since_time`` is
    the first run of the point the rise started at, where known (for a run without a
    commit)."""

    crept: bool | None
    rise: float = 0.0
    fraction: float | None = None
    p: float = 1.0
    since: str | None = None
    runs: int = 0
    commits: int = 0
    first: float = math.nan
    last: float = math.nan
    since_time: int | None = None


def creep(commits: Commits, limit: CreepLimit, *, min_bytes: float) -> Creep:
    """Whether the commits' values crept past ``limit`` (see the module's doc)."""
    y = commits.values
    if commits.runs < MIN_RUNS or len(y) < MIN_POINTS:
        return Creep(None, runs=commits.runs, commits=len(y))
    x = np.arange(len(y), dtype=np.float64)
    fitted = trend(x, y)
    rise = fitted.slope * (len(y) - 1)
    start = fitted.intercept
    base = abs(start) or float(np.median(np.abs(y)))
    fraction = rise / base if base else None
    floor = max(limit.fraction * base, min_bytes, NOISE_SIGMAS * commits.noise)
    crept = fitted.p < CREEP_ALPHA and rise > floor
    at = onset(y) if crept else None
    since = None if at is None else commits.names[at]
    since_time = None if at is None or not commits.times else commits.times[at]
    ends = float(y[0]), float(y[-1])
    return Creep(crept, rise, fraction, fitted.p, since, commits.runs, len(y), *ends, since_time)


def onset(y: np.ndarray) -> int:
    """The first commit of a rise: of the least-squares lines that are flat up to a commit and
    straight after it, and the steps from one level to another, the one that fits best (of
    the values' logarithms where all are above zero: a creep by a share a commit is straight
    there); the commit after the bend, or the first on the new level."""
    y = np.log(y) if len(y) and y.min() > 0 else y
    x = np.arange(len(y), dtype=np.float64)
    best, at = math.inf, 0
    for k in range(1, len(y)):
        bend = np.maximum(x - (k - 1), 0.0)  # straight from commit k on
        step = (x >= k).astype(np.float64)  # a new level from commit k on
        for shape in (bend, step):
            design = np.stack([np.ones_like(x), shape], axis=1)
            coef, *_ = np.linalg.lstsq(design, y, rcond=None)
            error = float(((design @ coef - y) ** 2).sum())
            if error < best * (1 - 1e-9):
                best, at = error, k
    return at


def steps(commits: Commits, *, min_bytes: float) -> list[int]:
    """The commits at which the values stepped (each the first on its new level), in order."""
    found: list[int] = []
    _split(commits.values, 0, commits.noise, min_bytes, found)
    return sorted(found)


def _split(y: np.ndarray, offset: int, noise: float, min_bytes: float, found: list[int]) -> None:
    n = len(y)
    if n < 4:
        return
    level = float(np.median(np.abs(y)))
    floor = max(STEP * level, min_bytes, NOISE_SIGMAS * noise)
    k = np.arange(2, n - 1)
    total = np.cumsum(y)
    means = total[k - 1] / k, (total[-1] - total[k - 1]) / (n - k)
    at = int(k[np.argmax(np.abs(means[1] - means[0]) * np.sqrt(k * (n - k) / n))])
    if abs(float(np.median(y[at:]) - np.median(y[:at]))) <= floor:
        return
    found.append(offset + at)
    _split(y[:at], offset, noise, min_bytes, found)
    _split(y[at:], offset + at, noise, min_bytes, found)

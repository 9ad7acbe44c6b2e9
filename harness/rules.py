"""Judge a memory timeline: ``judge(samples, rules) -> Verdict``.

Samples are grouped by ``(phase, epoch)``; a group's *series* is its most frequent per-batch
label (``batch`` set, OOM events left out), ordered by batch, in one metric: ``rules.metric``
if every sample of the series has it, else ``rss``. Each group is judged on its own and, per
phase, the worst group is reported as the finding; every group's numbers and checks are kept.

Leak (P0, needs ``max_growth``). After the first ``warmup`` batches (by batch index), with
``T = max_growth``, the series is a leak when

1. the Mann-Kendall test finds an increasing trend (one-sided p < :data:`ALPHA`, at least
   :data:`MIN_TREND_POINTS` batches), and
2. its growth exceeds ``T``: growth is the larger of the Theil-Sen slope x batch span and the
   robust end-to-end delta (median of the last eighth, at least 5 batches, minus median of the
   first eighth), and
3. no re-check clears it (below).

A single large batch barely moves the Theil-Sen slope, the Mann-Kendall statistic or the edge
medians, so it is judged by ``max_peak`` alone. Growth that stays to the end of the loop counts
whether it came gradually or as one persistent step: ``warmup`` is where one-time allocations
belong.

Re-check, after PyTorch's CUDA leak check (which re-reads after ``gc.collect()`` and
``empty_cache()`` before calling anything a leak): look at the samples after the loop's last
batch and before the next loop starts. Memory that grows then is freed when the phase ends is
still a leak *inside* the phase (the loop held it; a smaller device runs out of memory before
the end), so an uncollected sample of the same group back within ``T`` of the loop's start level
*confirms* the leak ("released when the phase ended"). Otherwise, if the last collected sample
of the same group in that window (other phases' samples never count) is back within ``T``, the
growth was memory only collection gives back (garbage in reference cycles, allocator caches):
not a leak, and the check says so. A collected sample still above ``T`` confirms the leak as
retained. Without a collected sample the in-loop evidence stands alone. An END read without
collection (the recorder's default) is what tells the two apart; a phase recorded with
``collect=True`` makes its END the re-check itself.

Peak (P1, ``max_peak``): the highest reading of a group above its first sample; a sample's
``peak`` metric (the high-water mark since the previous checkpoint) is used where present, read
against ``allocated`` on CUDA (samples with ``reserved``), ``rss`` on CPU (samples with ``rss``),
the primary metric otherwise; samples without ``peak`` use the primary metric. The first
sample's own ``peak`` covers time before the phase and is not used.

Drift (P2, ``max_drift``): every non-batch checkpoint label seen in several epochs, each later
epoch's first reading against the earliest epoch's, leaving out the first ``warmup_epochs``
(default 1: the first epoch creates the optimizer state and the allocator's caches).

Teardown (P0, ``teardown``): the last collected sample at or after ``SESSION_END`` (or after the
last batch when there is none) against ``SESSION_START`` (or the first sample);
``session START``/``session END``, as a recorder's ``phase("session")`` names them, count too.
Drift and teardown are run-wide and ignore ``rules.phase``.

OOM (P0): a sample labelled ``OOM`` or whose note mentions running out of memory (or an
exceeded emulated capacity), or an ``error`` that is an out-of-memory error. Fragmentation (P2,
a warning that does not fail the verdict): on CUDA, ``reserved - allocated`` grows with a trend
by more than ``max(FRAGMENTATION_FLOOR, max_growth)`` while ``allocated`` grows by under a
quarter of that.

Check (P1): a sample labelled ``CHECK_FAILED`` (:data:`CHECK_FAILED`), which a trainer-invariant
check records with a note saying what broke; one finding per phase, with the first note and the
count. Like OOM events, these samples are never part of a loop's series or of drift.

Status: ERROR when ``error`` is given and is not an OOM, else FAIL when any finding other than
fragmentation exists, else PASS.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, NamedTuple

import numpy as np

from harness.sample import Sample
from harness.stats import Trend, edge_window, robust_delta, trend
from harness.units import format_size, parse_size

SCHEMA_VERSION = 1
KINDS = ("leak", "peak", "drift", "teardown", "oom", "check", "fragmentation")
SEVERITY = {
    "oom": "P0",
    "leak": "P0",
    "teardown": "P0",
    "peak": "P1",
    "check": "P1",
    "drift": "P2",
    "fragmentation": "P2",
}
ALPHA = 0.01
MIN_TREND_POINTS = 6
FRAGMENTATION_FLOOR = 64 * 2**20
FALLBACK_METRIC = "rss"
CHECK_FAILED = "CHECK_FAILED"

_SIZE_FIELDS = ("max_growth", "max_peak", "max_drift", "teardown")
_OOM_TEXT = re.compile(r"(?i:out of memory|\bcapacity\b.*\bexceeded\b)|\bOOM\b")
_OOM_TYPES = ("MemoryError", "OutOfMemoryError")


@dataclass(frozen=True)
class Rules:
    """What a timeline must satisfy. Sizes take bytes or strings such as ``"50MB"``/``"512KiB"``
    and are stored as ints; ``None`` switches a rule off. ``phase`` takes a name or several
    (stored as a tuple); ``None`` judges every phase that has per-batch samples.
    """

    phase: str | tuple[str, ...] | None = None
    max_growth: int | str | None = None
    warmup: int = 5
    max_peak: int | str | None = None
    max_drift: int | str | None = None
    warmup_epochs: int = 1
    teardown: int | str | None = None
    metric: str = "allocated"

    def __post_init__(self) -> None:
        if self.phase is not None:
            phases = (self.phase,) if isinstance(self.phase, str) else self.phase
            if not isinstance(phases, Sequence) or not phases:
                raise ValueError(f"Rules.phase: expected a phase name or names, got {phases!r}")
            if not all(isinstance(p, str) and p for p in phases):
                raise ValueError(f"Rules.phase: phase names must be non-empty strings: {phases!r}")
            object.__setattr__(self, "phase", tuple(phases))
        for name in _SIZE_FIELDS:
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, parse_size(value, what=f"Rules.{name}"))
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(
                f"Rules.warmup: expected a number of batches >= 0, got {self.warmup!r}"
            )
        if (
            isinstance(self.warmup_epochs, bool)
            or not isinstance(self.warmup_epochs, int)
            or self.warmup_epochs < 0
        ):
            raise ValueError(
                f"Rules.warmup_epochs: expected a number of epochs >= 0, got {self.warmup_epochs!r}"
            )
        if not isinstance(self.metric, str) or not self.metric:
            raise ValueError(f"Rules.metric: expected a metric name, got {self.metric!r}")

    def selects(self, phase: str | None) -> bool:
        """Whether the per-phase rules apply to ``phase``."""
        return self.phase is None or phase in self.phase

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        data = asdict(self)
        data["phase"] = list(self.phase) if self.phase is not None else None
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Rules:
        """Build from a mapping (a marker's keywords, a JSON object); unknown keys are errors."""
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            known = ", ".join(f.name for f in fields(cls))
            raise ValueError(f"unknown rule(s) {sorted(unknown)}; known rules: {known}")
        return cls(**data)


@dataclass(frozen=True)
class Evidence:
    """One sample that shows a finding: its position in the judged list and its reading."""

    index: int
    label: str
    phase: str | None
    epoch: int | None
    batch: int | None
    metric: str | None
    value: int | None
    collected: bool = False


@dataclass(frozen=True)
class Finding:
    """A rule broken (or, for fragmentation, a warning). ``bytes`` is the amount judged: growth,
    peak rise, drift, teardown residue, the reading at an OOM, or the allocator-cache growth;
    ``slope`` is bytes per batch where a trend applies. ``severity`` follows ``kind``.
    """

    kind: str
    phase: str | None
    epoch: int | None
    bytes: int | None
    message: str
    slope: float | None = None
    evidence: tuple[Evidence, ...] = ()
    severity: str = ""

    def __post_init__(self) -> None:
        if self.kind not in SEVERITY:
            raise ValueError(f"Finding.kind: {self.kind!r} is not one of {', '.join(KINDS)}")
        object.__setattr__(self, "severity", SEVERITY[self.kind])
        object.__setattr__(self, "evidence", tuple(self.evidence))

    @property
    def blocking(self) -> bool:
        """Whether this finding fails the verdict (every kind but fragmentation)."""
        return self.kind != "fragmentation"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        """Inverse of :meth:`to_dict`."""
        values = _known(cls, data)
        values["evidence"] = tuple(_build(Evidence, e) for e in values.get("evidence", ()))
        return _build(cls, values)


@dataclass(frozen=True)
class PhaseStats:
    """One ``(phase, epoch)`` group's numbers, in bytes of ``metric``.

    ``start``/``end`` are its first and last readings; ``growth`` (after warm-up, the larger of
    slope x span and the robust delta), ``slope`` (per batch), ``p_value`` (Mann-Kendall, for
    increase) and ``noise`` (robust residual spread) describe the series ``label``; ``peak`` is
    the highest reading and ``peak_rise`` its rise above ``start``. ``batches`` counts the
    series' samples and ``judged`` those after warm-up; ``budget`` is ``max_growth``.
    """

    phase: str | None
    epoch: int | None
    label: str
    metric: str | None
    status: str
    batches: int = 0
    judged: int = 0
    start: int | None = None
    end: int | None = None
    growth: float | None = None
    slope: float | None = None
    p_value: float | None = None
    noise: float | None = None
    peak: int | None = None
    peak_rise: int | None = None
    budget: int | None = None


@dataclass(frozen=True)
class Check:
    """One rule applied to one scope, with its outcome: PASS, FAIL, WARN, SKIP or ERROR."""

    rule: str
    scope: str
    status: str
    details: str
    measured: float | None = None
    limit: int | None = None


@dataclass(frozen=True)
class Verdict:
    """The judgement of a timeline: status, findings, per-group statistics, every check."""

    status: str
    findings: tuple[Finding, ...] = ()
    phases: tuple[PhaseStats, ...] = ()
    checks: tuple[Check, ...] = ()
    rules: Rules = field(default_factory=Rules)
    error: str | None = None

    @property
    def passed(self) -> bool:
        """``status == "PASS"``."""
        return self.status == "PASS"

    def of_kind(self, kind: str) -> list[Finding]:
        """The findings of one kind."""
        return [f for f in self.findings if f.kind == kind]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, ``schema_version`` first."""
        return {
            "schema_version": SCHEMA_VERSION,
            "status": self.status,
            "error": self.error,
            "rules": self.rules.to_dict(),
            "findings": [f.to_dict() for f in self.findings],
            "phases": [asdict(p) for p in self.phases],
            "checks": [asdict(c) for c in self.checks],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verdict:
        """Inverse of :meth:`to_dict`; refuses verdicts from a newer schema."""
        version = data.get("schema_version")
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise ValueError(
                f"verdict schema_version {version!r} is not readable (<= {SCHEMA_VERSION})"
            )
        return cls(
            status=data["status"],
            error=data.get("error"),
            rules=Rules.from_dict(data.get("rules") or {}),
            findings=tuple(Finding.from_dict(f) for f in data.get("findings", ())),
            phases=tuple(_build(PhaseStats, p) for p in data.get("phases", ())),
            checks=tuple(_build(Check, c) for c in data.get("checks", ())),
        )


def judge(
    samples: Iterable[Sample],
    rules: Rules | Mapping[str, Any] | None = None,
    *,
    error: BaseException | str | None = None,
) -> Verdict:
    """Judge ``samples`` (in timeline order) against ``rules``; see the module docstring.

    ``rules`` may be a mapping of :class:`Rules` fields. ``error`` is what the run raised, if
    anything: an out-of-memory error becomes an ``oom`` finding, anything else makes the
    status ERROR (the timeline is still judged).
    """
    if rules is None:
        rules = Rules()
    elif not isinstance(rules, Rules):
        rules = Rules.from_dict(rules)
    return _Judgement(list(samples), rules).run(error)


@dataclass
class _GroupResult:
    stats: PhaseStats
    findings: list[Finding]


class _Judgement:
    def __init__(self, samples: list[Sample], rules: Rules) -> None:
        self.samples = samples
        self.rules = rules
        self.findings: list[Finding] = []
        self.checks: list[Check] = []
        self.phases: list[PhaseStats] = []
        self.loop_positions = [i for i, s in enumerate(samples) if _in_loop(s)]

    def run(self, error: BaseException | str | None) -> Verdict:
        self.judge_phases()
        self.judge_drift()
        self.judge_teardown()
        self.judge_checks()
        message = self.judge_oom(error)
        if message is not None:
            status = "ERROR"
        elif any(f.blocking for f in self.findings):
            status = "FAIL"
        else:
            status = "PASS"
        return Verdict(
            status,
            tuple(self.findings),
            tuple(self.phases),
            tuple(self.checks),
            self.rules,
            message,
        )

    # -- per phase ------------------------------------------------------------------------------

    def judge_phases(self) -> None:
        groups: dict[tuple[str | None, int | None], list[int]] = {}
        for i, s in enumerate(self.samples):
            groups.setdefault((s.phase, s.epoch), []).append(i)
        looped = {k: v for k, v in groups.items() if any(_in_loop(self.samples[i]) for i in v)}
        for phase in self.rules.phase or ():
            if all(k[0] != phase for k in looped):
                self.checks.append(
                    Check("phase", phase, "SKIP", f"no per-batch samples in phase {phase!r}")
                )
        by_phase: dict[str | None, list[_GroupResult]] = {}
        for key, indices in looped.items():
            if self.rules.selects(key[0]):
                result = self.judge_group(key, indices)
                self.phases.append(result.stats)
                by_phase.setdefault(key[0], []).append(result)
        for results in by_phase.values():
            for kind in ("leak", "peak", "fragmentation"):
                hits = [f for r in results for f in r.findings if f.kind == kind]
                if hits:
                    worst = max(hits, key=lambda f: f.bytes or 0)
                    if len(results) > 1:
                        worst = replace(
                            worst, message=f"{worst.message} ({len(hits)} of {len(results)} epochs)"
                        )
                    self.findings.append(worst)

    def judge_group(self, key: tuple[str | None, int | None], indices: list[int]) -> _GroupResult:
        phase, epoch = key
        scope = _scope(phase, epoch)
        looped = [i for i in indices if _in_loop(self.samples[i])]
        label = Counter(self.samples[i].label for i in looped).most_common(1)[0][0]
        series = [i for i in looped if self.samples[i].label == label]
        metric = self.choose_metric(series)
        series = sorted(
            (i for i in series if metric and self.samples[i].get(metric) is not None),
            key=lambda i: self.samples[i].batch,
        )
        checks_before = len(self.checks)
        findings: list[Finding] = []
        if not series or metric is None:
            self.checks.append(
                Check("readings", scope, "SKIP", f"no {self.rules.metric} or rss readings")
            )
            stats = PhaseStats(phase, epoch, label, metric, "SKIP", batches=len(looped))
            return _GroupResult(stats, findings)
        first_batch = self.samples[series[0]].batch
        judged = [i for i in series if self.samples[i].batch >= first_batch + self.rules.warmup]
        readings = [i for i in indices if self.samples[i].get(metric) is not None]
        start, end = readings[0], readings[-1]
        fit = _Fit.of(*self.values(judged, metric))

        if self.rules.max_growth is not None:
            findings += self.check_leak(key, fit, judged, metric)
        peak = self.peak_of(indices, start, metric)
        if self.rules.max_peak is not None:
            findings += self.check_peak(key, peak)
        findings += self.check_fragmentation(key, judged)

        statuses = {c.status for c in self.checks[checks_before:]}
        status = next((s for s in ("FAIL", "WARN", "PASS", "SKIP") if s in statuses), "PASS")
        stats = PhaseStats(
            phase=phase,
            epoch=epoch,
            label=label,
            metric=metric,
            batches=len(series),
            judged=len(judged),
            start=self.samples[start].get(metric),
            end=self.samples[end].get(metric),
            growth=fit.growth if fit else None,
            slope=fit.trend.slope if fit else None,
            p_value=fit.trend.p if fit else None,
            noise=fit.trend.noise if fit else None,
            peak=peak.value,
            peak_rise=peak.rise,
            budget=self.rules.max_growth,
            status=status,
        )
        return _GroupResult(stats, findings)

    def choose_metric(self, series: list[int]) -> str | None:
        """The rule's metric if every sample has it, else rss if every sample has it, else the
        one read most often (samples without it are then left out)."""
        candidates = list(dict.fromkeys((self.rules.metric, FALLBACK_METRIC)))
        counts = {m: sum(self.samples[i].get(m) is not None for i in series) for m in candidates}
        for m in candidates:
            if series and counts[m] == len(series):
                return m
        best = max(candidates, key=lambda m: counts[m])
        return best if counts[best] else None

    def check_leak(
        self, key: tuple[str | None, int | None], fit: _Fit | None, judged: list[int], metric: str
    ) -> list[Finding]:
        scope = _scope(*key)
        limit = self.rules.max_growth
        assert limit is not None
        if fit is None or len(judged) < MIN_TREND_POINTS:
            self.checks.append(
                Check(
                    "max_growth",
                    scope,
                    "SKIP",
                    f"{len(judged)} batches after {self.rules.warmup} warm-up: too few for a trend"
                    f" (need {MIN_TREND_POINTS})",
                    None,
                    limit,
                )
            )
            return []
        t = fit.trend
        summary = (
            f"{format_size(fit.growth, signed=True)} over {fit.span:g} batches after warm-up, "
            f"{_rate(t.slope)}, trend p={t.p:.2g}"
        )
        if not (t.p < ALPHA and fit.growth > limit):
            self.checks.append(Check("max_growth", scope, "PASS", summary, fit.growth, limit))
            return []
        released, recheck = self.after_loop(key, judged[-1], metric, fit.baseline + limit)
        evidence = [self.evidence(i, metric) for i in (judged[0], judged[-1])]
        if released is not None:
            note = f"released when the phase ended ({self.reading(released, metric, fit)})"
            evidence.append(self.evidence(released, metric))
        elif recheck is not None and self.samples[recheck].get(metric) <= fit.baseline + limit:
            details = (
                f"{summary}, but collected {self.reading(recheck, metric, fit)} is back within "
                "max_growth: reclaimed by collection, not a leak"
            )
            self.checks.append(Check("max_growth", scope, "PASS", details, fit.growth, limit))
            return []
        elif recheck is not None:
            note = f"retained after collection ({self.reading(recheck, metric, fit)})"
            evidence.append(self.evidence(recheck, metric))
        else:
            note = "no collected re-check after the loop"
        self.checks.append(
            Check("max_growth", scope, "FAIL", f"{summary}; {note}", fit.growth, limit)
        )
        message = (
            f"leak in {scope}: {_rate(t.slope)}, {format_size(fit.growth, signed=True)} "
            f"> max_growth {format_size(limit)} (trend p={t.p:.2g}); {note}"
        )
        return [
            Finding("leak", key[0], key[1], round(fit.growth), message, t.slope, tuple(evidence))
        ]

    def after_loop(
        self, key: tuple[str | None, int | None], last: int, metric: str, level: float
    ) -> tuple[int | None, int | None]:
        """Between the loop's last batch and the next loop, among the samples of the same group:
        the first uncollected one, before any collection, at or below ``level``; and the last
        collected one. Positions, or None. Samples of other phases never clear a leak: what the
        code frees after the phase (a function returning, say) says nothing of the phase."""
        stop = next(
            (i for i in self.loop_positions if i > last and _key(self.samples[i]) != key),
            len(self.samples),
        )
        window = [i for i in range(last + 1, stop) if self.samples[i].get(metric) is not None]
        collected = [
            i for i in window if self.samples[i].collected and _key(self.samples[i]) == key
        ]
        before = [i for i in window if not collected or i < collected[0]]
        own = [
            i
            for i in before
            if _key(self.samples[i]) == key and self.samples[i].get(metric) <= level
        ]
        return (own[0] if own else None), (collected[-1] if collected else None)

    def peak_of(self, indices: list[int], start: int, metric: str) -> _Peak:
        """The group's highest reading and its rise above the reading at ``start``."""
        first = self.samples[start]
        best = _Peak(start, metric, start, metric, first.get(metric), 0)
        for i in indices[indices.index(start) + 1 :]:
            s = self.samples[i]
            base = _peak_base(s, metric)
            if s.get("peak") is not None and first.get(base) is not None:
                peak = _Peak(i, "peak", start, base, s.get("peak"), s.get("peak") - first.get(base))
            elif s.get(metric) is not None:
                peak = _Peak(
                    i, metric, start, metric, s.get(metric), s.get(metric) - first.get(metric)
                )
            else:
                continue
            if peak.rise > best.rise:
                best = peak
        return best

    def check_peak(self, key: tuple[str | None, int | None], peak: _Peak) -> list[Finding]:
        scope = _scope(*key)
        limit = self.rules.max_peak
        assert limit is not None
        where = _where(self.samples[peak.at])
        rise = format_size(peak.rise, signed=True)
        details = f"peak {format_size(peak.value)} at {where}, {rise} above start"
        if peak.rise <= limit:
            self.checks.append(Check("max_peak", scope, "PASS", details, peak.rise, limit))
            return []
        self.checks.append(Check("max_peak", scope, "FAIL", details, peak.rise, limit))
        message = f"peak in {scope}: {rise} above start at {where} > max_peak {format_size(limit)}"
        evidence = (self.evidence(peak.start, peak.base), self.evidence(peak.at, peak.metric))
        return [Finding("peak", key[0], key[1], peak.rise, message, None, evidence)]

    def check_fragmentation(
        self, key: tuple[str | None, int | None], judged: list[int]
    ) -> list[Finding]:
        if len(judged) < MIN_TREND_POINTS or any(
            self.samples[i].get("reserved") is None or self.samples[i].get("allocated") is None
            for i in judged
        ):
            return []
        scope = _scope(*key)
        x, reserved = self.values(judged, "reserved")
        x, used = self.values(judged, "allocated")
        allocated = _Fit.of(x, used)
        gap = _Fit.of(x, [r - a for r, a in zip(reserved, used, strict=True)])
        assert gap is not None and allocated is not None
        limit = max(FRAGMENTATION_FLOOR, self.rules.max_growth or 0)
        details = (
            f"reserved - allocated {format_size(gap.growth, signed=True)}, "
            f"allocated {format_size(allocated.growth, signed=True)}"
        )
        if not (gap.trend.p < ALPHA and gap.growth > limit and allocated.growth < gap.growth / 4):
            self.checks.append(Check("fragmentation", scope, "PASS", details, gap.growth, limit))
            return []
        self.checks.append(Check("fragmentation", scope, "WARN", details, gap.growth, limit))
        message = (
            f"fragmentation in {scope}: reserved grew {format_size(gap.growth, signed=True)} "
            f"more than allocated ({format_size(allocated.growth, signed=True)})"
        )
        evidence = tuple(self.evidence(i, "reserved") for i in (judged[0], judged[-1]))
        return [
            Finding(
                "fragmentation",
                key[0],
                key[1],
                round(gap.growth),
                message,
                gap.trend.slope,
                evidence,
            )
        ]

    # -- run-wide -------------------------------------------------------------------------------

    def judge_drift(self) -> None:
        limit = self.rules.max_drift
        if limit is None:
            return
        firsts: dict[str, dict[int, int]] = {}
        for i, s in enumerate(self.samples):
            if s.batch is None and s.epoch is not None and not _is_event(s):
                firsts.setdefault(s.label, {}).setdefault(s.epoch, i)
        failures: list[Finding] = []
        for label, by_epoch in firsts.items():
            epochs = sorted(by_epoch)[self.rules.warmup_epochs :]
            if len(epochs) < 2:
                continue
            ref = by_epoch[epochs[0]]
            worst: tuple[int, int, str] | None = None
            for e in epochs[1:]:
                metric = self.pair_metric(ref, by_epoch[e])
                if metric is None:
                    continue
                drift = self.samples[by_epoch[e]].get(metric) - self.samples[ref].get(metric)
                if worst is None or drift > worst[0]:
                    worst = (drift, by_epoch[e], metric)
            if worst is None:
                self.checks.append(Check("max_drift", label, "SKIP", "no comparable readings"))
                continue
            drift, at, metric = worst
            details = (
                f"epoch {self.samples[at].epoch} vs epoch {epochs[0]}: "
                f"{format_size(drift, signed=True)} ({metric})"
            )
            status = "FAIL" if drift > limit else "PASS"
            self.checks.append(Check("max_drift", label, status, details, drift, limit))
            if status == "FAIL":
                message = (
                    f"drift at {label}: {format_size(drift, signed=True)} from epoch {epochs[0]} "
                    f"to epoch {self.samples[at].epoch} > max_drift {format_size(limit)}"
                )
                evidence = (self.evidence(ref, metric), self.evidence(at, metric))
                failures.append(
                    Finding(
                        "drift",
                        self.samples[at].phase,
                        self.samples[at].epoch,
                        drift,
                        message,
                        None,
                        evidence,
                    )
                )
        if failures:
            worst_finding = max(failures, key=lambda f: f.bytes or 0)
            if len(failures) > 1:
                worst_finding = replace(
                    worst_finding,
                    message=f"{worst_finding.message} ({len(failures)} labels drift)",
                )
            self.findings.append(worst_finding)

    def judge_teardown(self) -> None:
        limit = self.rules.teardown
        if limit is None:
            return
        labels = [s.label.upper().replace(" ", "_") for s in self.samples]
        start = labels.index("SESSION_START") if "SESSION_START" in labels else 0
        if "SESSION_END" in labels:
            end = len(labels) - 1 - labels[::-1].index("SESSION_END")
        else:
            end = (self.loop_positions[-1] + 1) if self.loop_positions else 0
        after = [i for i in range(end, len(self.samples)) if self.samples[i].collected]
        if not after:
            self.checks.append(
                Check(
                    "teardown",
                    "session",
                    "SKIP",
                    "no collected sample after the session end",
                    None,
                    limit,
                )
            )
            return
        at = after[-1]
        metric = self.pair_metric(start, at)
        if metric is None:
            self.checks.append(Check("teardown", "session", "SKIP", "no comparable readings"))
            return
        residue = self.samples[at].get(metric) - self.samples[start].get(metric)
        details = (
            f"{self.samples[at].label} {format_size(residue, signed=True)} vs "
            f"{self.samples[start].label} ({metric})"
        )
        if residue <= limit:
            self.checks.append(Check("teardown", "session", "PASS", details, residue, limit))
            return
        self.checks.append(Check("teardown", "session", "FAIL", details, residue, limit))
        message = (
            f"teardown: {format_size(residue, signed=True)} still held after the session and "
            f"collection > teardown {format_size(limit)}"
        )
        evidence = (self.evidence(start, metric), self.evidence(at, metric))
        self.findings.append(Finding("teardown", "session", None, residue, message, None, evidence))

    def judge_checks(self) -> None:
        """One ``check`` finding per phase with ``CHECK_FAILED`` samples."""
        by_phase: dict[str | None, list[int]] = {}
        for i, s in enumerate(self.samples):
            if s.label == CHECK_FAILED:
                by_phase.setdefault(s.phase, []).append(i)
        for phase, failed in by_phase.items():
            first = self.samples[failed[0]]
            note = (first.note or "no note").strip().splitlines()[0]
            count = f" ({len(failed)} failures)" if len(failed) > 1 else ""
            message = f"check failed at {_where(first)}: {note}{count}"
            scope = phase if phase is not None else "(no phase)"
            self.checks.append(Check("check", scope, "FAIL", f"{len(failed)} CHECK_FAILED: {note}"))
            evidence = tuple(self.evidence(i, None) for i in dict.fromkeys((failed[0], failed[-1])))
            self.findings.append(
                Finding("check", phase, first.epoch, None, message, None, evidence)
            )

    def judge_oom(self, error: BaseException | str | None) -> str | None:
        """Add OOM findings and checks; return the error message when it is not an OOM."""
        ooms = [i for i, s in enumerate(self.samples) if _is_oom(s)]
        # A checkpoint over an emulated capacity and the OOM event the trainer then reports
        # for the same batch are one failure: one finding, with both samples as evidence.
        events: list[list[int]] = []
        for i in ooms:
            if events and _place(self.samples[events[-1][0]]) == _place(self.samples[i]):
                events[-1].append(i)
            else:
                events.append([i])
        for event in events:
            s = self.samples[event[0]]
            metric = next(
                (m for m in ("peak", self.rules.metric, FALLBACK_METRIC) if s.get(m) is not None),
                None,
            )
            note = (s.note or "out of memory").strip().splitlines()[0]
            message = f"out of memory at {_where(s)}: {note}"
            self.findings.append(
                Finding(
                    "oom",
                    s.phase,
                    s.epoch,
                    s.get(metric) if metric else None,
                    message,
                    None,
                    tuple(self.evidence(i, metric) for i in event),
                )
            )
        text = None if error is None else _error_text(error)
        error_is_oom = error is not None and _is_oom_error(error)
        if error_is_oom and not ooms:
            self.findings.append(Finding("oom", None, None, None, f"out of memory: {text}"))
        failed = bool(ooms) or error_is_oom
        details = f"{len(events)} OOM event(s)" + (f"; raised {text}" if error_is_oom else "")
        self.checks.append(Check("oom", "run", "FAIL" if failed else "PASS", details))
        if error is None or error_is_oom:
            return None
        self.checks.append(Check("error", "run", "ERROR", f"raised {text}"))
        return text

    # -- helpers --------------------------------------------------------------------------------

    def values(self, positions: list[int], metric: str) -> tuple[list[int], list[int]]:
        """Batch indices and readings of ``metric`` at ``positions``."""
        return [self.samples[i].batch for i in positions], [
            self.samples[i].get(metric) for i in positions
        ]

    def reading(self, i: int, metric: str, fit: _Fit) -> str:
        """``LABEL +x.xMB`` relative to the loop's starting level."""
        value = self.samples[i].get(metric)
        return f"{self.samples[i].label} {format_size(value - fit.baseline, signed=True)}"

    def pair_metric(self, a: int, b: int) -> str | None:
        for m in dict.fromkeys((self.rules.metric, FALLBACK_METRIC)):
            if self.samples[a].get(m) is not None and self.samples[b].get(m) is not None:
                return m
        return None

    def evidence(self, i: int, metric: str | None) -> Evidence:
        s = self.samples[i]
        value = s.get(metric) if metric else None
        return Evidence(i, s.label, s.phase, s.epoch, s.batch, metric, value, s.collected)


class _Peak(NamedTuple):
    """A group's highest reading: where (``at``, in ``metric``), and its ``rise`` above the
    reading of ``base`` at ``start``."""

    at: int
    metric: str
    start: int
    base: str
    value: int
    rise: int


@dataclass(frozen=True)
class _Fit:
    """A series after warm-up: its trend, growth (the larger of slope x span and the robust
    delta), batch span and starting level (median of the first edge window)."""

    trend: Trend
    growth: float
    span: float
    baseline: float

    @classmethod
    def of(cls, x: Sequence[int], y: Sequence[int]) -> _Fit | None:
        if len(x) < 2:
            return None
        t = trend(x, y)
        span = float(x[-1] - x[0])
        baseline = float(np.median(y[: edge_window(len(y))]))
        return cls(t, max(t.slope * span, robust_delta(y)), span, baseline)


def _peak_base(s: Sample, metric: str) -> str:
    """The metric whose high-water mark ``peak`` is: allocated on CUDA, rss on CPU."""
    if s.get("reserved") is not None:
        return "allocated"
    return FALLBACK_METRIC if s.get(FALLBACK_METRIC) is not None else metric


def _in_loop(s: Sample) -> bool:
    return s.batch is not None and not _is_event(s)


def _is_event(s: Sample) -> bool:
    """An OOM or a failed check: something that happened, not a reading of the loop."""
    return _is_oom(s) or s.label == CHECK_FAILED


def _key(s: Sample) -> tuple[str | None, int | None]:
    return (s.phase, s.epoch)


def _place(s: Sample) -> tuple[str | None, int | None, int | None]:
    return s.phase, s.epoch, s.batch


def _is_oom(s: Sample) -> bool:
    return s.label.upper() == "OOM" or bool(s.note and _OOM_TEXT.search(s.note))


def _is_oom_error(error: BaseException | str) -> bool:
    if isinstance(error, BaseException):
        names = [c.__name__ for c in type(error).__mro__]
        if any(n in _OOM_TYPES or n.endswith("OOM") for n in names):
            return True
    return bool(_OOM_TEXT.search(str(error)))


def _error_text(error: BaseException | str) -> str:
    if isinstance(error, BaseException):
        text = str(error).strip().splitlines()
        return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
    return error.strip().splitlines()[0] if error.strip() else "error"


def _scope(phase: str | None, epoch: int | None) -> str:
    name = phase if phase is not None else "(no phase)"
    return name if epoch is None else f"{name} epoch {epoch}"


def _where(s: Sample) -> str:
    parts = [s.label]
    if s.epoch is not None:
        parts.append(f"epoch {s.epoch}")
    if s.batch is not None:
        parts.append(f"batch {s.batch}")
    return " ".join(parts)


def _rate(slope: float) -> str:
    return f"{slope / 1024:+.1f}KB/batch"


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _build(cls: type, data: Mapping[str, Any]) -> Any:
    try:
        return cls(**_known(cls, data))
    except TypeError as exc:
        raise ValueError(f"cannot read {cls.__name__} from {dict(data)!r}: {exc}") from None

"""The verdict model: what was found (:class:`Verdict` of :class:`Finding` and :class:`Check`)
against the rules (:class:`~harness._verdict.options.Rules`, kept on the verdict), with their JSON
form.

Statuses, kinds, severities and outcomes are string enums, so they compare equal to, and are
written to JSON as, their plain names; statuses and severities know their order (``rank``,
``worst``). Every option a front end offers (marker keyword, ini option, ``leakgate report``
flag, the report's rules row) is a :class:`Rules` field (:mod:`harness._verdict.options`). The JSON
form is ``SCHEMA_VERSION`` 2; version 1 documents (without ``rule`` and ``outcome`` on findings)
still load.

Each dataclass checks its fields when made (:func:`~harness._verdict.fields.check_fields`), and
each enum the name it is given: what its annotation does not allow is a
:class:`~harness._core.errors.BadArgument` naming the field (``Finding.kind``); read from a
document (``from_dict``), a :class:`~harness._core.errors.BadInput`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any, Self

from harness._core.errors import BadArgument, BadInput
from harness._core.json_values import shown
from harness._verdict.fields import check_fields
from harness._verdict.options import Rules

SCHEMA_VERSION = 2


class _Named(StrEnum):
    """A string enum that refuses a name outside it with a
    :class:`~harness._core.errors.BadArgument` (a ``ValueError``, as an enum's refusal is)."""

    @classmethod
    def _missing_(cls, value: object) -> None:
        names = ", ".join(cls)
        raise BadArgument(f"{shown(value)} is not a valid {cls.__name__} (one of {names})")


class _Ranked(_Named):
    """An enum whose members are declared from the mildest to the most severe."""

    @property
    def rank(self) -> int:
        """How severe: 0 for the mildest member, higher for worse."""
        return list(type(self)).index(self)

    @classmethod
    def worst(cls, values: Iterable[str], default: Self | None = None) -> Self:
        """The most severe of ``values`` (plain names or members); ``default`` when empty."""
        found = max((cls(v) for v in values), key=lambda m: m.rank, default=default)
        if found is None:
            raise BadArgument(f"{cls.__name__}.worst: no values and no default")
        return found


class Status(_Ranked):
    """A verdict's or a phase's outcome, mildest first."""

    PASS = "PASS"
    FAIL = "FAIL"
    ERROR = "ERROR"


class CheckStatus(_Ranked):
    """One rule applied to one scope, mildest first: SKIP judged nothing, WARN does not fail a
    verdict, ERROR could not judge."""

    SKIP = "SKIP"
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    ERROR = "ERROR"


class Kind(_Named):
    """What a finding is about."""

    LEAK = "leak"
    PEAK = "peak"
    DRIFT = "drift"
    TEARDOWN = "teardown"
    OOM = "oom"
    CHECK = "check"
    FRAGMENTATION = "fragmentation"
    CACHE = "cache"
    CHILD_LEAK = "child-leak"
    COPY_ON_READ = "copy-on-read"
    OUTSIDE = "outside"
    PROFILER = "profiler"


class Severity(_Ranked):
    """How urgent a finding is, mildest first: P0 is the most severe."""

    P2 = "P2"
    P1 = "P1"
    P0 = "P0"


class Outcome(_Named):
    """What the re-check after a leaking loop saw: the memory was ``released`` when the phase
    ended, ``retained`` after a collection, or ``unchecked`` (no collected reading after it)."""

    RELEASED = "released"
    RETAINED = "retained"
    UNCHECKED = "unchecked"


KINDS = tuple(Kind)
SEVERITY = {
    Kind.OOM: Severity.P0,
    Kind.LEAK: Severity.P0,
    Kind.TEARDOWN: Severity.P0,
    Kind.PEAK: Severity.P1,
    Kind.CHECK: Severity.P1,
    Kind.DRIFT: Severity.P2,
    Kind.FRAGMENTATION: Severity.P2,
    Kind.CACHE: Severity.P2,
    Kind.CHILD_LEAK: Severity.P0,
    Kind.COPY_ON_READ: Severity.P2,
    Kind.OUTSIDE: Severity.P0,
    Kind.PROFILER: Severity.P2,
}
WARNINGS = (Kind.FRAGMENTATION, Kind.CACHE, Kind.COPY_ON_READ, Kind.PROFILER)
"""Kinds that warn without failing a verdict, unless a finding is ``over_budget``."""
OVER_BUDGET = Severity.P1
"""The severity of a warning's finding that is over its budget (and so blocks)."""


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

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class Finding:
    """A rule broken (or, for fragmentation, a warning). ``bytes`` is the amount judged: growth,
    peak rise, drift, teardown residue, the reading at an OOM, or the allocator-cache growth;
    ``slope`` is bytes per batch where a trend applies. ``severity`` follows ``kind`` (P1 for a
    warning's kind ``over_budget``, which then blocks); ``rule`` names the rule that found it;
    ``outcome`` says what a leak's re-check saw.
    """

    kind: Kind
    phase: str | None
    epoch: int | None
    bytes: int | None
    message: str
    slope: float | None = None
    evidence: tuple[Evidence, ...] = ()
    severity: Severity = Severity.P0
    rule: str = ""
    outcome: Outcome | None = None
    over_budget: bool = False

    def __post_init__(self) -> None:
        check_fields(self)
        kind = Kind(self.kind)
        object.__setattr__(self, "kind", kind)
        raised = self.over_budget and kind in WARNINGS
        object.__setattr__(self, "severity", OVER_BUDGET if raised else SEVERITY[kind])
        object.__setattr__(self, "rule", self.rule or kind.value)
        if self.outcome is not None:
            object.__setattr__(self, "outcome", Outcome(self.outcome))
        object.__setattr__(self, "evidence", tuple(self.evidence))

    @property
    def blocking(self) -> bool:
        """Whether this finding fails the verdict (every kind but the warnings', unless over
        their budget)."""
        return self.kind not in WARNINGS or self.over_budget

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

    ``start``/``end`` are its first and last readings; ``growth`` (after warm-up, the fitted
    line's rise to the loop's last batch), ``slope`` (per batch, after the onset), ``p_value``
    (Mann-Kendall, for increase) and ``noise`` (robust residual spread) describe the series
    ``label``; ``onset`` is the batch where its growth started, when after the first judged
    one, and ``stopped`` the batch where it stopped for good (a plateau); ``peak`` is the
    highest reading and
    ``peak_rise`` its rise above ``start``, in ``peak_metric``. ``batches`` counts the series'
    batches and ``judged`` those read after warm-up; ``budget`` is ``max_growth``; ``baseline``
    is the loop's start level (read over its first ``baseline_batches`` judged batches), what a
    leak's re-check compares against.
    """

    phase: str | None
    epoch: int | None
    label: str
    metric: str | None
    status: CheckStatus
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
    peak_metric: str | None = None
    baseline: float | None = None
    baseline_batches: int | None = None
    onset: float | None = None
    stopped: float | None = None

    def __post_init__(self) -> None:
        check_fields(self)


RAISED = "error"
"""The rule of the check that holds what the run raised."""
CONFIGURATION = "configuration"
"""The rule of the checks that hold a configuration mistake: a rule that matched no checkpoint."""


@dataclass(frozen=True)
class Check:
    """One rule applied to one scope, with its outcome (a :class:`CheckStatus`)."""

    rule: str
    scope: str
    status: CheckStatus
    details: str
    measured: float | None = None
    limit: int | None = None

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class Verdict:
    """The judgement of a timeline: status, findings, per-group statistics, every check."""

    status: Status
    findings: tuple[Finding, ...] = ()
    phases: tuple[PhaseStats, ...] = ()
    checks: tuple[Check, ...] = ()
    rules: Rules = field(default_factory=Rules)
    error: str | None = None
    beside: tuple[PhaseStats, ...] = ()
    """Each loop's numbers in the measures judged beside the rules' metric (Python's objects
    and pools are in it; what no counter explains, the host beside a device, are beside it:
    :mod:`harness._rules.measures`)."""

    def __post_init__(self) -> None:
        check_fields(self)
        object.__setattr__(self, "status", Status(self.status))

    @property
    def passed(self) -> bool:
        """``status == "PASS"``."""
        return self.status == Status.PASS

    @property
    def error_kind(self) -> str | None:
        """What made an ERROR verdict: ``raised`` (the run raised, or no check says otherwise),
        ``configuration`` (a rule that matched no checkpoint: a misspelt phase, no checkpoints
        at all) or ``unjudged`` (a rule that judged nothing or could not judge); None for any
        other status."""
        if self.status != Status.ERROR:
            return None
        ruled = {c.rule for c in self.checks if c.status == CheckStatus.ERROR}
        if RAISED in ruled or not ruled:
            return "raised"
        return CONFIGURATION if CONFIGURATION in ruled else "unjudged"

    def of_kind(self, kind: str) -> list[Finding]:
        """The findings of one kind."""
        return [f for f in self.findings if f.kind == kind]

    def worst(self) -> Finding | None:
        """The most severe finding (blocking before warnings, P0 before P1, larger first)."""
        ranked = sorted(
            self.findings, key=lambda f: (not f.blocking, -f.severity.rank, -(f.bytes or 0))
        )
        return ranked[0] if ranked else None

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
            "beside": [asdict(p) for p in self.beside],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verdict:
        """Inverse of :meth:`to_dict`; reads schema 1 and 2, refuses newer ones."""
        version = check_schema_version(data.get("schema_version"))
        rules = data.get("rules") or {}
        if not isinstance(rules, Mapping):
            raise BadInput("expected an object", field="rules")
        rules = {k: v for k, v in rules.items() if version > 1 or k != "written"}
        read = Rules.from_dict(rules)
        findings = tuple(Finding.from_dict(f) for f in _list(data, "findings"))
        phases = tuple(_build(PhaseStats, p) for p in _list(data, "phases"))
        checks = tuple(_build(Check, c) for c in _list(data, "checks"))
        beside = tuple(_build(PhaseStats, p) for p in _list(data, "beside"))
        try:
            return cls(data["status"], findings, phases, checks, read, data.get("error"), beside)
        except BadArgument as exc:  # the document's value, not a caller's argument
            raise BadInput(exc.problem, field=exc.field) from None


def check_schema_version(version: Any) -> int:
    """``version`` when a verdict of that schema reads (1 to :data:`SCHEMA_VERSION`)."""
    if (
        isinstance(version, bool)
        or not isinstance(version, int)
        or not 1 <= version <= SCHEMA_VERSION
    ):
        raise BadInput(
            f"verdict schema_version {version!r} is not readable (1 to {SCHEMA_VERSION})"
        )
    return version


def _list(data: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise BadInput("expected a list of objects", field=key)
    return value


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _build(cls: type, data: Mapping[str, Any]) -> Any:
    if not isinstance(data, Mapping):
        raise BadInput(f"cannot read {cls.__name__} from {data!r}")
    try:
        return cls(**_known(cls, data))
    except (TypeError, ValueError) as exc:
        raise BadInput(f"cannot read {cls.__name__}: {exc}") from None

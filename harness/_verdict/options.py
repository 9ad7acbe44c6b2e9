"""What a timeline must satisfy: :class:`Rules`, and the metadata of its fields that every
front end reads (marker keywords, ``memleak_*`` ini options, ``leakgate report`` flags, the
report's rules row): a new option is one field here, and one parameter of the ``__init__``
written out for type checkers, which repeats every field in the form a caller gives it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import Field, asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from harness._core.errors import BadArgument, BadInput, refused_as_argument
from harness._core.json_values import check_tree
from harness._core.markdown import code, table
from harness._core.units import parse_size

CHILD_METRICS = ("heap", "anon")
"""What ``child_metric`` may name: a child's live heap where it publishes one (else its anon),
or every child's anon, read from outside."""
_OUTSIDE = ("uss", "pss")
"""``child_metric`` values of older timelines: RSS-side readings from outside, now ``anon``."""


Size = int | str
"""A size as a caller gives it: bytes, or text such as ``"50MB"``
(:func:`~harness._core.units.parse_size`)."""


def _option(
    help: str, kind: str = "str", *, live: bool = False, fallback: str | None = None
) -> Any:
    """A :class:`Rules` field's metadata: its help text, how text is read into it (``kind``),
    whether it shapes what a live run records rather than what is judged (``live``: a
    rebuild from a timeline cannot apply it, and it never changes a verdict), and the option
    that stands in for it while it is not set (``fallback``)."""
    return {"help": help, "kind": kind, "live": live, "fallback": fallback}


@dataclass(frozen=True)
class Rules:
    """What a timeline must satisfy. Sizes take bytes or strings such as ``"50MB"``/``"512KiB"``
    and are stored as ints (``written`` keeps them as given, for messages); ``None`` switches a
    rule off. ``phase`` takes a name or several (stored as a tuple); ``None`` judges every phase
    that has per-batch samples. ``custom`` holds the options of registered rules, by name.
    Every value refused, of the wrong type or the wrong value, raises
    :class:`~harness._core.errors.BadArgument` naming the field.
    """

    phase: tuple[str, ...] | None = field(
        default=None,
        metadata=_option(
            "phase(s) judged, comma-separated (default: every phase with batches)", "phases"
        ),
    )
    max_growth: int | None = field(
        default=None, metadata=_option("growth allowed in a phase after warm-up, e.g. 50MB", "size")
    )
    warmup: int = field(
        default=5, metadata=_option("batches left out at the start of each phase", "count")
    )
    max_peak: int | None = field(
        default=None, metadata=_option("peak allowed above a phase's start", "size")
    )
    max_drift: int | None = field(
        default=None, metadata=_option("drift allowed for a checkpoint across epochs", "size")
    )
    warmup_epochs: int = field(
        default=1, metadata=_option("epochs left out of the drift comparison", "count")
    )
    teardown: int | None = field(
        default=None, metadata=_option("memory allowed to remain after the run ends", "size")
    )
    metric: str = field(default="allocated", metadata=_option("metric judged", "name"))
    allow_unjudged: bool = field(
        default=False,
        metadata=_option(
            "let a rule that saw nothing to judge pass (default: the verdict is ERROR)", "flag"
        ),
    )
    project_to: int | None = field(
        default=None,
        metadata=_option(
            "batches a phase runs for real: a significant per-batch slope projected over them "
            "must stay within max_projected (default max_growth)",
            "count",
        ),
    )
    max_projected: int | None = field(
        default=None,
        metadata=_option(
            "growth allowed in a phase projected over project_to batches",
            "size",
            fallback="max_growth",
        ),
    )
    cache_is_leak: bool = field(
        default=False,
        metadata=_option(
            "judge growth that stops and stays flat (a cache that fills, a bounded window) or "
            "shrinks to nothing epoch over epoch as a leak too (default: a P2 cache warning)",
            "flag",
        ),
    )
    attribute: bool = field(
        default=False,
        compare=False,
        metadata=_option(
            "name who holds new tensors at every phase end, not only where a phase first "
            "grows past max_growth",
            "flag",
            live=True,
        ),
    )
    explain: bool = field(
        default=False,
        compare=False,
        metadata=_option(
            "also note the line that allocated every tensor and Python object (slower)",
            "flag",
            live=True,
        ),
    )
    snapshot: bool = field(
        default=False,
        compare=False,
        metadata=_option(
            "on CUDA, record the allocator's history and keep <test>.snapshot.pickle for a "
            "failing leak, OOM or teardown",
            "flag",
            live=True,
        ),
    )
    children: bool = field(
        default=True,
        metadata=_option(
            "record and judge the memory of child processes (DataLoader workers, subprocesses)",
            "flag",
        ),
    )
    child_metric: str = field(
        default="heap",
        metadata=_option(
            "children's memory judged: heap (live heap read inside each child where it "
            "publishes one, else anon) or anon (resident anonymous memory, read from outside)",
            "name",
        ),
    )
    max_child_growth: int | None = field(
        default=None,
        metadata=_option(
            "growth a child process may gain in a phase after warm-up (all children together: "
            "that times their number)",
            "size",
            fallback="max_growth",
        ),
    )
    max_copy_on_read: int | None = field(
        default=None,
        metadata=_option(
            "pages a worker may copy from its parent in a phase by reading Python objects "
            "(copy-on-read) before it fails (default: a P2 warning only)",
            "size",
        ),
    )
    host: bool = field(
        default=True,
        metadata=_option(
            "beside a device that is not the host (a GPU), also record and judge the host "
            "process's memory by the same rules",
            "flag",
        ),
    )
    custom: Mapping[str, Any] = field(
        default_factory=dict, metadata=_option("options of registered rules, by name", "mapping")
    )
    written: Mapping[str, str] = field(
        default_factory=dict, compare=False, repr=False, metadata={"kind": "internal"}
    )

    if TYPE_CHECKING:  # the forms a caller may give; the fields hold them parsed

        def __init__(
            self,
            phase: str | Sequence[str] | None = None,
            max_growth: Size | None = None,
            warmup: int = 5,
            max_peak: Size | None = None,
            max_drift: Size | None = None,
            warmup_epochs: int = 1,
            teardown: Size | None = None,
            metric: str = "allocated",
            allow_unjudged: bool = False,
            project_to: int | None = None,
            max_projected: Size | None = None,
            cache_is_leak: bool = False,
            attribute: bool = False,
            explain: bool = False,
            snapshot: bool = False,
            children: bool = True,
            child_metric: str = "heap",
            max_child_growth: Size | None = None,
            max_copy_on_read: Size | None = None,
            host: bool = True,
            custom: Mapping[str, Any] = ...,
            written: Mapping[str, str] = ...,
        ) -> None: ...

    def __post_init__(self) -> None:
        object.__setattr__(self, "phase", check_phases(self.phase, where="Rules.phase"))
        if not isinstance(self.written, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.written.items()
        ):
            problem = f"expected a mapping of option names to text, got {self.written!r}"
            raise BadArgument(problem, field="Rules.written")
        written = dict(self.written)
        for name in size_fields():
            value = getattr(self, name)
            if value is not None:
                if isinstance(value, str):
                    written.setdefault(name, " ".join(value.split()))
                object.__setattr__(self, name, parse_size(value, what=f"Rules.{name}"))
            else:
                written.pop(name, None)
        object.__setattr__(self, "written", written)
        for name in ("warmup", "warmup_epochs"):
            check_count(getattr(self, name), where=f"Rules.{name}")
        if self.project_to is not None:
            check_count(self.project_to, where="Rules.project_to", least=1)
        for name in flag_fields():
            check_flag(getattr(self, name), where=f"Rules.{name}")
        if not isinstance(self.metric, str) or not self.metric:
            problem = f"expected a metric name, got {self.metric!r}"
            raise BadArgument(problem, field="Rules.metric")
        if self.child_metric in _OUTSIDE:
            object.__setattr__(self, "child_metric", "anon")
        if self.child_metric not in CHILD_METRICS:
            raise BadArgument(
                f"expected one of {', '.join(CHILD_METRICS)}, got {self.child_metric!r}",
                field="Rules.child_metric",
            )
        if not isinstance(self.custom, Mapping) or not all(isinstance(k, str) for k in self.custom):
            problem = f"expected a mapping of rule names, got {self.custom!r}"
            raise BadArgument(problem, field="Rules.custom")
        # Written to the timeline and the verdict: only what reads back as it was written.
        with refused_as_argument():
            check_tree(self.custom, written=True, where="Rules.custom")
        object.__setattr__(self, "custom", dict(self.custom))

    def selects(self, phase: str | None) -> bool:
        """Whether the per-phase rules apply to ``phase``."""
        return self.phase is None or phase in self.phase

    def size(self, name: str) -> int | None:
        """The size rule named ``name`` (one of :func:`size_fields`) in bytes; ``None`` when off."""
        value: int | None = getattr(self, name)
        return value

    def budget(self, name: str) -> str | None:
        """The size option that bounds what ``name`` judges: ``name`` itself when set, else the
        option its metadata falls back to when that is set (``max_child_growth`` and
        ``max_projected``: ``max_growth``); None when neither is."""
        if getattr(self, name) is not None:
            return name
        fallback = self.__dataclass_fields__[name].metadata.get("fallback")
        return fallback if fallback and getattr(self, fallback) is not None else None

    def shown(self, name: str) -> str:
        """A size rule as the user wrote it (``"50MB"``), or its bytes when given as an int."""
        value = getattr(self, name)
        if value is None:
            fallback = self.__dataclass_fields__[name].metadata.get("fallback")
            return f"= {fallback}" if fallback and getattr(self, fallback) is not None else "off"
        return self.written.get(name) or f"{value}B"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        data = asdict(self)
        data["phase"] = list(self.phase) if self.phase is not None else None
        data["written"] = dict(self.written)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Rules:
        """Build from a mapping (a marker's keywords, a JSON object); unknown keys are errors
        (:class:`~harness._core.errors.BadArgument`, as a refused field is)."""
        if not isinstance(data, Mapping):
            raise BadArgument(f"expected a mapping, got {type(data).__name__}", field="rules")
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise BadArgument(
                f"unknown rule{'s' * (len(unknown) != 1)} {sorted(map(str, unknown))}; known "
                "rules: " + ", ".join(option_names())
            )
        return cls(**data)


def check_phases(value: object, *, where: str) -> tuple[str, ...] | None:
    """A phase name or names (a string, or a sequence of them as a list or tuple) as a tuple;
    ``None`` stays ``None``. Raises :class:`~harness._core.errors.BadArgument` naming ``where``."""
    if value is None:
        return None
    phases = (value,) if isinstance(value, str) else value
    if not isinstance(phases, Sequence) or not phases:
        raise BadArgument(f"expected a phase name or names, got {phases!r}", field=where)
    if not all(isinstance(p, str) and p for p in phases):
        raise BadArgument(f"phase names must be non-empty strings: {phases!r}", field=where)
    return tuple(phases)


def check_count(value: object, *, where: str, least: int = 0) -> int:
    """``value`` when it is a whole number of at least ``least`` (batches, epochs); else
    :class:`~harness._core.errors.BadArgument` naming ``where``, with the same message from every
    front end."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise BadArgument(f"expected a whole number >= {least}, got {value!r}", field=where)
    return value


def check_flag(value: object, *, where: str) -> bool:
    """``value`` when it is True or False; else :class:`~harness._core.errors.BadArgument`
    naming ``where`` (a truthy 1 or ``"yes"`` is refused, not read as one)."""
    if not isinstance(value, bool):
        raise BadArgument(f"expected True or False, got {value!r}", field=where)
    return value


def options() -> Iterator[Field[Any]]:
    """The :class:`Rules` fields a user sets (marker keywords, ini options, CLI flags)."""
    return (f for f in fields(Rules) if f.metadata.get("kind") not in ("internal", "mapping"))


def option_names() -> list[str]:
    return [f.name for f in options()]


def size_fields() -> tuple[str, ...]:
    return _of_kind("size")


def flag_fields() -> tuple[str, ...]:
    return _of_kind("flag")


def judged_options() -> Iterator[Field[Any]]:
    """The options that decide a verdict (every option but the ``live`` ones): what a rebuild
    from a timeline takes and what a report lists."""
    return (f for f in options() if not f.metadata["live"])


_KINDS = {
    "size": "size (50MB, 512KiB)",
    "count": "whole number",
    "flag": "true or false",
    "name": "name",
    "phases": "name(s)",
}


def options_table() -> list[str]:
    """The options a marker, an ini file (``memleak_<name>``) and ``leakgate report`` take, as
    a markdown table: the README's, generated from the fields' metadata."""
    rows: list[list[str]] = []
    for option in options():
        meta = option.metadata
        if meta["fallback"] is not None:
            default: str = code(meta["fallback"])
        elif option.default is None:
            default = "every phase" if meta["kind"] == "phases" else "off"
        else:
            value = option.default
            default = code(str(value).lower() if isinstance(value, bool) else value)
        rows.append([code(option.name), _KINDS[meta["kind"]], default, meta["help"]])
    return table(["option", "takes", "default", "what it sets"], rows)


def _of_kind(kind: str) -> tuple[str, ...]:
    return tuple(f.name for f in fields(Rules) if f.metadata.get("kind") == kind)


def parse_option(name: str, text: str) -> Any:
    """A rule option given as text (an ini value, a CLI flag) in its field's type: a size in
    bytes (the text, as written, is the caller's to keep in ``Rules.written``).

    Raises :class:`~harness._core.errors.BadInput` naming the option for text that does not read as
    one.
    """
    kind = next((f.metadata["kind"] for f in options() if f.name == name), None)
    if kind is None:
        raise BadInput(f"unknown rule {name!r}; known rules: {', '.join(option_names())}")
    text = text.strip()
    if kind == "count":
        try:
            return int(text)
        except ValueError:
            raise BadInput(f"expected a whole number, got {text!r}", field=name) from None
    if kind == "flag":
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise BadInput(f"expected true or false, got {text!r}", field=name)
    if kind == "phases":
        return tuple(p.strip() for p in text.split(",") if p.strip()) or None
    if kind == "size":
        return parse_size(text, what=name)
    return text

"""One reading of device memory at a named checkpoint, and the one declaration of its fields.

:class:`Sample` is the schema: each fixed field is declared once, with its kind and meaning in
the field's metadata (:func:`column`), and :data:`FIELDS` reads them back. The store's
columns, the timeline's writer, both of its readers and the rules' columns are built from
:data:`FIELDS` by kind, so that a new per-sample field is one line below. ``metrics`` (the
probe's readings, open-ended by name) stays a mapping beside them.

Kinds: ``text`` (interned strings, None allowed unless the field is required), ``int`` (a
whole number in int64, None allowed), ``float`` (a finite float), ``bool`` and ``note``
(text that most samples lack, kept sparse).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import harness._core.labels as labels
from harness._core.errors import BadArgument, BadInput

FORMAT = 3
"""Version of the timeline format, written in the header as ``leakgate_timeline``. Version 2
adds the end record (``{"leakgate_end": {"error": ...}}``, written once the run is judged).
Version 3 writes what earlier ones left to text: a sample's ``event`` and ``edge``, the end
record's error as its ``type`` and ``message``, the header's ``capacity_metric``. Versions 1
and 2 still read: their samples' events and edges are derived where they are read
(:func:`~harness._timeline.checks.derived`), their error's type where it is asked for
(:attr:`~harness._timeline.checks.Timeline.error`)."""

FIELD_KINDS = ("text", "int", "float", "bool", "note")
METRICS = "metrics"
"""The field that holds the probe's readings by metric name, in bytes."""


@dataclass(frozen=True)
class Stride:
    """Where a probe's dear metrics (:attr:`harness._measure.probes.Probe.strided`) are read inside
    a long loop: at each of a label's first ``first`` batches since the last checkpoint that is
    not a batch's (a phase's start), then at every ``every``-th, and at every other
    checkpoint. The rules fit what was read."""

    first: int = 32
    every: int = 16

    def reads(self, run: Any) -> Any:
        """Whether a label's ``run``-th batch (counted from 0) is read; of each, for an array of
        them."""
        return (run < self.first) | (run % self.every == 0)


STRIDE = Stride()


def column(kind: str, meaning: str) -> dict[str, str]:
    """A field's metadata: its ``kind`` (one of :data:`FIELD_KINDS`) and what it means."""
    if kind not in FIELD_KINDS:
        raise BadArgument(f"kind must be one of {FIELD_KINDS}, not {kind!r}")
    return {"kind": kind, "meaning": meaning}


@dataclass(frozen=True)
class Sample:
    """Memory at one checkpoint.

    ``metrics`` maps a metric name to bytes, or to ``None`` where the probe cannot measure it.
    CUDA probes report ``allocated``, ``reserved``, ``peak`` (since the previous checkpoint),
    ``driver_used`` and ``device_used``; the CPU probe reports ``allocated`` (malloc's bytes in
    use), ``rss`` and ``peak``. ``note`` carries an event's text, such as an OOM message;
    ``event`` says what happened (:data:`harness._core.labels.EVENTS`), never the note's text.
    Live child processes add ``children_*`` and ``child_*:<role>`` metrics
    (:mod:`harness._measure.children`) and name themselves in ``processes``
    (:mod:`harness._measure.children`).
    """

    label: str = field(metadata=column("text", "the checkpoint's name"))
    phase: str | None = field(default=None, metadata=column("text", "the loop it belongs to"))
    epoch: int | None = field(default=None, metadata=column("int", "epoch number"))
    batch: int | None = field(default=None, metadata=column("int", "batch number in its loop"))
    time: float = field(default=0.0, metadata=column("float", "seconds since the Unix epoch"))
    metrics: Mapping[str, int | None] = field(default_factory=dict)
    collected: bool = field(default=False, metadata=column("bool", "gc ran before the reading"))
    note: str | None = field(default=None, metadata=column("note", "an event's text"))
    processes: str | None = field(
        default=None, metadata=column("text", "live child processes, as role=pid pairs")
    )
    event: str | None = field(
        default=None, metadata=column("note", "what happened here: OOM or CHECK_FAILED")
    )
    edge: str | None = field(
        default=None, metadata=column("note", "START or END: it opens or closes its phase")
    )

    def __post_init__(self) -> None:
        """A sample made by hand takes its event and edge from its label when not given
        (:func:`harness._core.labels.event_of`, :func:`~harness._core.labels.edge_of`); the recorder
        and the readers give them."""
        if self.event is None and isinstance(self.label, str):
            object.__setattr__(self, "event", labels.event_of(self.label))
        if self.edge is None and isinstance(self.label, str):
            object.__setattr__(self, "edge", labels.edge_of(self.label))

    def __eq__(self, other: object) -> bool:
        """Field by field, a metric read as None counting as one not read (a store holds a
        column for every metric, a timeline line only the metrics its sample had)."""
        if type(other) is not type(self):
            return NotImplemented
        mine, theirs = dict(self.__dict__), dict(other.__dict__)
        read = [{k: v for k, v in d.pop(METRICS).items() if v is not None} for d in (mine, theirs)]
        return mine == theirs and read[0] == read[1]

    __hash__ = None  # type: ignore[assignment]

    def get(self, metric: str) -> int | None:
        """Bytes of ``metric``, or ``None`` when it was not measured."""
        return self.metrics.get(metric)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (one timeline line)."""
        data = asdict(self)
        data[METRICS] = dict(self.metrics)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sample:
        """Inverse of :meth:`to_dict`; unknown keys are ignored so newer timelines still load."""
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        if not isinstance(known.get("label"), str):
            raise BadInput(f"without a label: {dict(data)!r}", field="sample")
        known[METRICS] = dict(known.get(METRICS) or {})
        return cls(**known)


@dataclass(frozen=True)
class Field:
    """One fixed field of a sample: its ``name``, ``kind``, meaning, default, and whether a
    sample must have it (``required``: no default)."""

    name: str
    kind: str
    meaning: str
    default: Any
    required: bool


def fields_of(record: type) -> tuple[Field, ...]:
    """The fixed fields a dataclass declares with :func:`column` metadata, in order."""
    found = []
    for f in dataclasses.fields(record):
        if "kind" not in f.metadata:
            continue
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        default = None if f.default is dataclasses.MISSING else f.default
        found.append(Field(f.name, f.metadata["kind"], f.metadata["meaning"], default, required))
    return tuple(found)


FIELDS = fields_of(Sample)
"""A sample's fixed fields (all but ``metrics``), in declaration order. The store, the
timeline and the rules' columns read it when they are built, not when imported."""


def line_order(fields: tuple[Field, ...]) -> list[str]:
    """The keys of a timeline line: the fields, with ``metrics`` where :class:`Sample` has it
    (after ``time``) or else last."""
    names = [f.name for f in fields]
    declared = [f.name for f in dataclasses.fields(Sample)]
    at = declared.index(METRICS)
    before = set(declared[:at])
    split = next((i for i, name in enumerate(names) if name not in before), len(names))
    return [*names[:split], METRICS, *names[split:]]

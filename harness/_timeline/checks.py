"""What a timeline may hold: its format versions and bounds, the :class:`Timeline` read back,
and the checks of a header and of a sample line (each field by its kind in
:data:`harness._measure.sample.FIELDS`). Every check raises :class:`~harness._core.errors.BadInput`
whose ``field`` says where; the readers add the file and the line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import harness._measure.sample as schema
from harness._core.errors import BadInput
from harness._core.json_values import check_tree, expect, finite_number, shown
from harness._core.labels import Raised, edge_of, legacy_event
from harness._core.units import parse_size
from harness._measure.sample import FORMAT, METRICS, Field, Sample, line_order
from harness._timeline.store import NONE, make_sample
from harness._verdict.options import size_fields

READS = (1, 2, 3)
"""The format versions :func:`~harness._timeline.jsonl.read_timeline` reads; any other is
refused."""

INT64_BOUND = 2**63
"""The largest magnitude a reading, an epoch or a batch number may have; whole numbers kept in
the store's int64 columns stay below it, and above ``-2**63`` (the store's mark for none)."""


@dataclass(frozen=True)
class Timeline:
    """A timeline as read back: ``torn`` counts skipped incomplete last lines (0 or 1); ``end``
    is the end record (``error``: what the run raised), None when the run did not write one.
    ``reader`` says which reader read it (see :func:`~harness._timeline.jsonl.read_timeline`):
    ``"columns"``, whose ``samples`` are a :class:`~harness._timeline.store.SampleStore`, or
    ``"lines"``, whose ``samples`` are a list."""

    header: dict[str, Any]
    samples: Sequence[Sample]
    torn: int = 0
    end: dict[str, Any] | None = None
    reader: str = field(default="lines", compare=False)

    @property
    def error(self) -> Raised | None:
        """What the run raised, as its end record says (in a version 1 or 2 record, one text:
        ``TypeName: message``, its type read from the text once, here)."""
        found = self.end.get("error") if self.end is not None else None
        if isinstance(found, Mapping):
            return Raised(found.get("type"), found.get("message") or "")
        if isinstance(found, str):
            head, _, tail = found.partition(":")
            named = head.strip().isidentifier()
            return Raised(head.strip(), tail.strip()) if named else Raised(None, found)
        return None


def check_header(header: Mapping[str, Any]) -> None:
    """Check what is read from a header: nesting, numbers JSON cannot round-trip, and the
    types of ``meta``, ``config``, ``rules``, ``run_id``, ``capacity_metric``, ``started`` and
    ``capacity``.

    Raises :class:`~harness._core.errors.BadInput` whose ``field`` is the field's path
    (``.meta.rules``)."""
    version = header.get("leakgate_timeline")
    if type(version) is not int or version not in READS:
        known = " and ".join(map(str, READS))
        raise BadInput(
            f"a timeline format this version does not read ({shown(version)}; it reads {known})",
            field=".leakgate_timeline",
        )
    check_tree(header)
    for key in ("meta", "config", "rules"):
        expect(header.get(key), (Mapping, type(None)), f".{key}", "an object")
    meta = header.get("meta")
    if isinstance(meta, Mapping):
        expect(meta.get("rules"), (Mapping, type(None)), ".meta.rules", "an object")
        expect(meta.get("test"), (str, type(None)), ".meta.test", "a string")
    for key in ("run_id", "capacity_metric"):
        expect(header.get(key), (str, type(None)), f".{key}", "a string")
    for key in ("started", "capacity"):
        value = header.get(key)
        if value is not None and (finite_number(value) is None or abs(value) > INT64_BOUND):
            raise BadInput(f"expected a finite number, got {shown(value)}", field=f".{key}")
    stored = [(".rules", header.get("rules"))]
    if isinstance(meta, Mapping):
        stored.append((".meta.rules", meta.get("rules")))
    for where, rules in stored:
        if not isinstance(rules, Mapping):
            continue
        for name in size_fields():
            value = rules.get(name)
            if value is not None:
                _check_size(value, f"{where}.{name}")


def check_end(end: Any) -> None:
    """Check an end record: ``error`` an object of a ``type`` (text or null) and a ``message``
    (text), text (versions 1 and 2) or null; ``rules`` an object of sizes that read;
    ``holders`` and ``shares`` lists of objects; nesting and numbers as :func:`check_tree`
    allows. Raises :class:`~harness._core.errors.BadInput` whose ``field`` is the field."""
    expect(end, (dict,), "", "an object")
    error = end.get("error")
    expect(error, (dict, str, type(None)), ".error", "an object, text or null")
    if isinstance(error, dict):
        expect(error.get("type"), (str, type(None)), ".error.type", "text or null")
        expect(error.get("message"), (str,), ".error.message", "text")
    check_tree(end)
    rules = end.get("rules")
    expect(rules, (Mapping, type(None)), ".rules", "an object")
    for name in size_fields() if isinstance(rules, Mapping) else ():
        if rules.get(name) is not None:
            _check_size(rules[name], f".rules.{name}")
    for key in ("holders", "shares"):
        value = end.get(key)
        expect(value, (list, type(None)), f".{key}", "a list")
        for i, item in enumerate(value or ()):
            expect(item, (dict,), f".{key}[{i}]", "an object")


def sample_of(record: Any, version: int = FORMAT) -> Sample:
    """A sample from one timeline line, each field of :data:`~harness._measure.sample.FIELDS`
    checked as its kind says (a field the line lacks takes its default); in a timeline of format
    ``version`` 1 or 2, its event and edge derived from what it has (:func:`derived`).

    Raises :class:`~harness._core.errors.BadInput` whose ``field`` is the field
    (``.metrics.rss``)."""
    if not isinstance(record, dict):
        raise BadInput(f"expected an object, got {shown(record)}")
    values = {}
    for f in schema.FIELDS:
        value = record.get(f.name, f.default)
        _check_field(f, value)
        values[f.name] = value
    metrics = record.get(METRICS)
    expect(metrics, (dict, type(None)), f".{METRICS}", "an object")
    for name, value in (metrics or {}).items():
        if value is not None and (
            finite_number(value) is None
            or abs(value) > INT64_BOUND
            or (isinstance(value, int) and not is_int64(value))
        ):
            raise BadInput(f"expected bytes or null, got {shown(value)}", field=f".metrics.{name}")
    values[METRICS] = dict(metrics or {})
    if version < 3:
        values["event"], values["edge"] = derived(values["label"], values["note"])
    return make_sample({name: values[name] for name in line_order(schema.FIELDS)})


def derived(label: str, note: str | None) -> tuple[str | None, str | None]:
    """The event and edge of a sample of a version 1 or 2 timeline, which kept neither: its
    label's, or ``OOM`` where its note says the device ran out of memory
    (:func:`harness._core.labels.legacy_event`)."""
    return legacy_event(label, note), edge_of(label)


def _check_field(f: Field, value: Any) -> None:
    """Refuse ``value`` for field ``f`` unless it has the field's kind."""
    where = f".{f.name}"
    if f.kind == "int":
        if value is not None and not is_int64(value):
            bound = " above -2**63 and below 2**63" if type(value) is int else ""
            raise BadInput(f"expected a whole number{bound}, got {shown(value)}", field=where)
    elif f.kind == "float":
        if finite_number(value) is None:
            raise BadInput(f"expected a finite number, got {shown(value)}", field=where)
    elif f.kind == "bool":
        expect(value, (bool,), where, "true or false")
    else:
        expect(value, (str,) if f.required else (str, type(None)), where, "a string")


def is_int64(value: Any) -> bool:
    """Whether ``value`` is a whole number an int64 column holds as itself: not a bool, above
    ``-2**63`` (the store's :data:`~harness._timeline.store.NONE`) and below ``2**63``."""
    return type(value) is int and NONE < value < INT64_BOUND


def _check_size(value: Any, where: str) -> None:
    try:
        parse_size(value, what=where)
    except ValueError:
        raise BadInput(f"not a size: {shown(value)}", field=where) from None

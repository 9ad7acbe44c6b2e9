"""The saved verdict's one schema: every field a verdict document (``<name>.json``) holds, the
kind of value it takes, and :func:`check_verdict`, the check a document gets when it is loaded.

Findings, phases, checks and evidence take their fields from their dataclasses in
:mod:`harness._verdict.model` (a field added there is checked here without a line more: its
annotation says its kind, ``X | None`` that it may be null, a field without a default that it
must be present; the kinds and their checks are :mod:`harness._verdict.fields`'s). The run's
fields around them are declared below. Each check raises
:class:`~harness._core.errors.BadInput` whose ``field`` is the field's path
(``findings[0].severity``, ``run.ended``, ``header.ranks[1].status``); a value of another type, a
name outside its choices and a number that is not finite (NaN, an infinity) are all refused.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

from harness._core.errors import BadInput
from harness._core.json_values import check_tree, shown
from harness._verdict.fields import (
    Spec,
    an_object,
    check_text,
    choice,
    count,
    flag,
    items,
    number,
    optional,
    spec_of,
    whole,
)
from harness._verdict.model import Check, Finding, PhaseStats, Status, check_schema_version


def file_name(value: Any, where: str) -> None:
    """A file name a report links to: text without NUL, no part longer than 255 bytes."""
    check_text(value, where)
    if "\0" in value or any(len(part) > 255 for part in value.split("/")):
        raise BadInput(f"not a file name: {shown(value)}", field=where)


def version(value: Any, where: str) -> None:
    check_schema_version(value)


def values(spec: Spec) -> Spec:
    """An object whose every value is ``spec`` (any keys: a checkpoint's metrics)."""

    def check(value: Any, where: str) -> None:
        an_object(value, where)
        for key, item in value.items():
            spec(item, _at(where, str(key)))

    return check


class Record:
    """An object with these ``fields`` (each checked when present; ``required`` must be);
    other keys are left alone."""

    def __init__(self, fields: Mapping[str, Spec], required: tuple[str, ...] = ()) -> None:
        self.fields = dict(fields)
        self.required = required

    def __call__(self, value: Any, where: str) -> None:
        an_object(value, where)
        for name, spec in self.fields.items():
            if name in value:
                spec(value[name], _at(where, name))
        for name in self.required:
            if name not in value:
                if not where:
                    raise BadInput(f"not a leakgate verdict (no {name!r})")
                raise BadInput(f"missing {name!r}", field=where)


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def of_dataclass(cls: type) -> Record:
    """The record a dataclass is written as: each field by its annotation (one of another
    dataclass as that one's record)."""
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    required = tuple(
        f.name
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )
    return Record({f.name: spec_of(hints[f.name], of_dataclass) for f in fields}, required)


FINDING = of_dataclass(Finding)
"""One finding, as :meth:`Finding.to_dict` writes it."""

RUN = Record(
    {
        "epochs_completed": optional(count),
        "epochs_planned": optional(whole),
        "samples": count,
        "torn": count,
        "ended": optional(flag),
        "duration_s": optional(number),
    }
)
"""``run``: how far the run went."""

CHECKPOINT = Record(
    {
        "name": check_text,
        "label": check_text,
        "phase": optional(check_text),
        "epoch": optional(whole),
        "collected": flag,
        "metrics": values(optional(number)),
    }
)
"""One named checkpoint's readings."""

HOLDER = Record(
    {
        "path": check_text,
        "container": check_text,
        "items": whole,
        "tensors": whole,
        "bytes": whole,
        "graph_bytes": whole,
        "sites": items(check_text),
        "phase": optional(check_text),
        "epoch": optional(whole),
        "label": optional(check_text),
        "note": check_text,
        "growth": optional(whole),
        "process": optional(check_text),
        "rank": optional(count),
    }
)
"""One holder the attribution named (:class:`harness._attribution.holder.Holder`'s fields, and the
rank it was named on in a merged run)."""

RANK = Record(
    {
        "rank": count,
        "run_id": optional(check_text),
        "status": choice(Status),
        "timeline": optional(check_text),
        "host": optional(check_text),
        "pid": optional(whole),
    },
    ("rank",),
)
"""One rank of a merged run, as ``header.ranks`` lists it."""

HEADER = Record(
    {
        "run_id": optional(check_text),
        "started": optional(number),
        "capacity": optional(number),
        "meta": optional(an_object),
        "config": optional(an_object),
        "rules": optional(an_object),
        "rank": optional(count),
        "world_size": optional(count),
        "ranks": optional(items(RANK)),
    }
)
"""The timeline header the run was recorded under (a merged run's lists its ranks)."""

DOCUMENT = Record(
    {
        "schema_version": version,
        "status": choice(Status),
        "error": optional(check_text),
        "rules": an_object,
        "findings": items(FINDING),
        "phases": items(of_dataclass(PhaseStats)),
        "checks": items(of_dataclass(Check)),
        "name": optional(check_text),
        "run_id": optional(check_text),
        "title": optional(check_text),
        "test": optional(check_text),
        "timeline": optional(check_text),
        "report": optional(file_name),
        "metric": optional(check_text),
        "run": optional(RUN),
        "worst_growth": optional(number),
        "checkpoints": items(CHECKPOINT),
        "attribution": items(HOLDER),
        "header": optional(HEADER),
    },
    ("schema_version", "status"),
)
"""A verdict document; its ``rules`` are :class:`~harness._verdict.options.Rules`' to check."""


def check_verdict(document: Any) -> None:
    """Check a verdict document: no nesting deeper than 64 levels or integer beyond a float's
    range anywhere in it (:func:`~harness._core.json_values.check_tree`), then every field against
    :data:`DOCUMENT`."""
    try:
        check_tree(document)
    except BadInput as exc:  # its path starts at the document: no leading dot
        raise BadInput(exc.problem, field=(exc.field or "").lstrip(".") or None) from None
    DOCUMENT(document, "")


def check_finding(finding: Finding) -> None:
    """Check a finding a rule returned, as it will be written and read back."""
    FINDING(finding.to_dict(), "finding")

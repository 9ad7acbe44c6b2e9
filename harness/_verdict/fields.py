"""The kinds of value a record's fields take, read from their annotations, and the checks that
refuse any other: the saved verdict's schema (:mod:`harness._verdict.schema`) checks a document's
fields with them, and the verdict's dataclasses (and a holder) check their own when made
(:func:`check_fields`).

An annotation says a field's kind: ``str``; ``int``, a whole number (never a bool); ``float``,
a finite number; ``bool``; a string enum, one of its names; ``X | None``, X or null;
``tuple[X, ...]``, a list of X. A field of another class holds what the caller's ``nested``
says: in a document, that class's record; in a value made, an instance of that class.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any

from harness._core.errors import BadInput, refused_as_argument
from harness._core.json_values import expect, finite_number, shown

Spec = Callable[[Any, str], None]
"""Checks one value; the second argument is where it is (its field's path)."""


def check_text(value: Any, where: str) -> None:
    expect(value, (str,), where, "a string")


def whole(value: Any, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadInput(f"expected a whole number, got {shown(value)}", field=where)


def count(value: Any, where: str) -> None:
    whole(value, where)
    if value < 0:
        raise BadInput(f"expected a whole number >= 0, got {value}", field=where)


def number(value: Any, where: str) -> None:
    if finite_number(value) is None:
        raise BadInput(f"expected a finite number, got {shown(value)}", field=where)


def flag(value: Any, where: str) -> None:
    expect(value, (bool,), where, "true or false")


def an_object(value: Any, where: str) -> None:
    """Any object (its content is checked elsewhere, or free: a run's config)."""
    expect(value, (Mapping,), where, "an object")


def choice(names: type[StrEnum]) -> Spec:
    """One of an enum's names."""
    allowed = [str(member) for member in names]

    def check(value: Any, where: str) -> None:
        check_text(value, where)
        if value not in allowed:
            raise BadInput(f"expected one of {', '.join(allowed)}, got {shown(value)}", field=where)

    return check


def optional(spec: Spec) -> Spec:
    """``spec``, or null."""

    def check(value: Any, where: str) -> None:
        if value is not None:
            spec(value, where)

    return check


def items(spec: Spec) -> Spec:
    """A list whose every item is ``spec``."""

    def check(value: Any, where: str) -> None:
        expect(value, (list, tuple), where, "a list")
        for i, item in enumerate(value):
            spec(item, f"{where}[{i}]")

    return check


def instance_of(cls: type) -> Spec:
    """An instance of ``cls``."""

    def check(value: Any, where: str) -> None:
        if not isinstance(value, cls):
            raise BadInput(f"expected a {cls.__name__}, got {shown(value)}", field=where)

    return check


_KINDS: dict[Any, Spec] = {str: check_text, int: whole, float: number, bool: flag}


def spec_of(hint: Any, nested: Callable[[type], Spec]) -> Spec:
    """The check a field's annotation stands for; ``nested(cls)`` for a class of no kind above."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        (inner,) = (a for a in args if a is not type(None))
        return optional(spec_of(inner, nested))
    if typing.get_origin(hint) is tuple:  # tuple[Evidence, ...]
        return items(spec_of(args[0], nested))
    if isinstance(hint, type) and issubclass(hint, StrEnum):
        return choice(hint)
    return _KINDS[hint] if hint in _KINDS else nested(hint)


_MADE: dict[type, list[tuple[str, Spec]]] = {}
"""Each dataclass's checks of its fields' values, made at its first instance."""


def check_fields(record: Any) -> None:
    """Refuse a dataclass instance holding a value its fields' annotations do not allow: a
    :class:`~harness._core.errors.BadArgument` whose ``field`` is ``Class.field``."""
    cls = type(record)
    checks = _MADE.get(cls)
    if checks is None:
        hints = typing.get_type_hints(cls)
        checks = [(f.name, spec_of(hints[f.name], instance_of)) for f in dataclasses.fields(cls)]
        _MADE[cls] = checks
    with refused_as_argument():
        for name, spec in checks:
            spec(getattr(record, name), f"{cls.__name__}.{name}")

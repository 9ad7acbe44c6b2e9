"""What a JSON value that leakgate writes or reads back may hold, and the small checks every
reader shares: a file read as JSON (:func:`read_json`), nesting no deeper than
:data:`MAX_DEPTH`, integers a float can hold, and, for a value handed in to be written (a
registered rule's option), JSON's own types with finite numbers only. Each check raises
:class:`~harness._core.errors.BadInput` whose ``field`` says where."""

from __future__ import annotations

import json
import math
import os
from typing import Any

from harness._core.errors import BadInput
from harness._core.fsio import read_regular

MAX_DEPTH = 64
"""How deeply a value may nest (a run's config is a few levels deep)."""


def read_json(path: str | os.PathLike[str]) -> Any:
    """The JSON value in the regular file ``path``; :class:`~harness._core.errors.BadInput` naming
    the file when it cannot be read, is not JSON or nests too deeply for the parser."""
    try:
        text = read_regular(path)
    except OSError as exc:
        raise BadInput(f"cannot read ({exc.strerror or exc})", path=path) from None
    try:
        return json.loads(text)
    except RecursionError:
        raise BadInput("nested too deeply", path=path) from None
    except ValueError:
        raise BadInput("not JSON", path=path) from None


def check_tree(root: Any, *, written: bool = False, where: str = "") -> None:
    """Refuse nesting deeper than :data:`MAX_DEPTH` and integers beyond a float's range; with
    ``written``, also anything JSON would not give back as it was (NaN and infinities, objects
    of other types, keys that are not strings). The error names where, after ``where`` (its
    first four steps)."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(root, ())]
    while stack:
        value, steps = stack.pop()
        problem = _problem(value, len(steps), written)
        if problem is not None:
            raise BadInput(problem, field=where + _path(steps))
        if isinstance(value, dict):
            stack += [(item, (*steps, f".{key}")) for key, item in value.items()]
        elif isinstance(value, (list, tuple)):
            stack += [(item, (*steps, f"[{i}]")) for i, item in enumerate(value)]


def _problem(value: Any, depth: int, written: bool) -> str | None:
    """What is wrong with ``value`` itself (not with what it holds), or None."""
    if value is None or isinstance(value, (bool, str)):
        return None
    if isinstance(value, int):
        return None if finite_number(value) is not None else "an integer beyond a float's range"
    if isinstance(value, float):
        finite = not written or math.isfinite(value)
        return None if finite else f"expected a finite number, got {value!r}"
    if isinstance(value, (dict, list, tuple)):
        if depth >= MAX_DEPTH:
            return f"nested more than {MAX_DEPTH} levels deep"
        if written and isinstance(value, dict) and not all(isinstance(k, str) for k in value):
            return "expected an object with text keys"
        return None
    if written:
        return (
            f"expected text, a number, true, false, null, a list or an object, got {shown(value)}"
        )
    return None


def _path(steps: tuple[str, ...]) -> str:
    return "".join(steps[:4]) + ("..." if len(steps) > 4 else "")


def expect(value: Any, types: tuple[type, ...], where: str, wanted: str) -> None:
    """Refuse ``value`` unless it is one of ``types`` (a bool only when ``bool`` is named)."""
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise BadInput(f"expected {wanted}, got {shown(value)}", field=where)


def finite_number(value: Any) -> float | None:
    """``value`` as a finite float; None for anything else (bools, text, inf, huge ints)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def shown(value: Any) -> str:
    """A value for a one-line message: its type, and its text when short."""
    kind = {dict: "an object", list: "a list", type(None): "null"}.get(type(value))
    if kind is not None:
        return kind
    text = repr(value)
    return text if len(text) <= 40 else f"{type(value).__name__} {text[:30]}..."

"""What an object weighs, read without running its own code, and whether it is leakgate's."""

from __future__ import annotations

import sys
import types
from typing import Any

_C_METHODS = (types.MethodDescriptorType, types.WrapperDescriptorType)
_PACKAGE = __name__.partition(".")[0]
_SELF_CHECK = f"{_PACKAGE}.selfcheck"


def size_of(obj: Any) -> int:
    """``sys.getsizeof(obj)`` where its type measures itself in C (a list, a numpy array with
    its buffer, a string); an object whose ``__sizeof__`` is Python code is weighed as a plain
    object instead: that code may do anything (a mock answers with a new mock)."""
    try:
        if isinstance(getattr(type(obj), "__sizeof__", None), _C_METHODS):
            return sys.getsizeof(obj)
        return object.__sizeof__(obj)
    except Exception:
        return 0


def is_ours(obj: Any) -> bool:
    """Whether ``obj``'s type is leakgate's own (its self-check plays a user's part)."""
    module = type(obj).__dict__.get("__module__")
    return isinstance(module, str) and own_module(module)


def own_module(name: str) -> bool:
    """Whether the module ``name`` is leakgate's."""
    return (name == _PACKAGE or name.startswith(_PACKAGE + ".")) and name != _SELF_CHECK

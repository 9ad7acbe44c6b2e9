"""What an object weighs, read without running its own code, and whether it is leakgate's."""

from __future__ import annotations

import gc
import sys
import types
from typing import Any

TENSOR_BYTES = 512
"""What a tensor object costs beyond its storage's bytes: its C++ ``TensorImpl``, sizes and
autograd record, which ``sys.getsizeof`` leaves out. Measured as the live heap's growth (glibc's
``mallinfo2``) over 20,000 kept tensors each, less the list's slot: 512 B a view of an older
tensor, 508 B a 0-d tensor beyond its 64-byte allocation, 336 to 382 B a small tensor with a
storage of its own; a container of many small views holds that much for each."""
_C_METHODS = (types.MethodDescriptorType, types.WrapperDescriptorType)
_PACKAGE = __name__.partition(".")[0]
_SELF_CHECK = f"{_PACKAGE}._frontends.selfcheck"


def size_of(obj: Any) -> int:
    """What the allocator gives for ``obj`` (:func:`allotted`): ``sys.getsizeof(obj)`` where its
    type measures itself in C (a list, a numpy array with its buffer, a string); an object whose
    ``__sizeof__`` is Python code is weighed as a plain object instead: that code may do
    anything (a mock answers with a new mock). An instance's attribute values held beside it
    count too (:func:`inline_values`)."""
    if type(getattr(type(obj), "__sizeof__", None)) in _C_METHODS:
        return allotted(sys.getsizeof(obj)) + inline_values(obj)
    return allotted(object.__sizeof__(obj)) + inline_values(obj)


_MANAGED_DICT = 1 << 4
_INLINE_VALUES = sys.version_info[:2] in ((3, 11), (3, 12))


def inline_values(obj: Any) -> int:
    """What the array of an instance's attribute values takes, where Python 3.11 and 3.12 keep
    them apart from the object until its ``__dict__`` is asked for (a dict, an object of its
    own, holds them then): ``sys.getsizeof`` leaves it out, though it is most of a plain
    instance (80 B of the 145 B an instance of 7 attributes takes, measured). Counted as
    ``gc`` sees the values, one slot each, behind a prefix of a byte a slot; 0 where a dict
    is among them (its ``__dict__``, which is weighed itself, or a dict attribute: not told
    apart)."""
    if not _INLINE_VALUES or not type(obj).__flags__ & _MANAGED_DICT:
        return 0
    referents = gc.get_referents(obj)
    if any(type(r) is dict for r in referents):
        return 0
    slots = len(referents) - 1  # less its class
    return allotted((slots + 2 + 7) // 8 * 8 + 8 * slots) if slots > 0 else 0


SMALL = 512
"""The largest request Python's own allocator serves, in blocks of 16-byte steps; larger ones
go to ``malloc``, whose chunks carry an 8-byte header and are 16-byte aligned, 32 B at least."""


def allotted(size: int) -> int:
    """The bytes an allocation of ``size`` takes as the live heap counts it: a pymalloc block,
    or a ``malloc`` chunk."""
    if size <= SMALL:
        return (size + 15) & ~15
    return max(32, (size + 8 + 15) & ~15)


def is_ours(obj: Any) -> bool:
    """Whether ``obj``'s type is leakgate's own (its self-check plays a user's part)."""
    module = type(obj).__dict__.get("__module__")
    return isinstance(module, str) and own_module(module)


def own_module(name: str) -> bool:
    """Whether the module ``name`` is leakgate's."""
    return (name == _PACKAGE or name.startswith(_PACKAGE + ".")) and name != _SELF_CHECK

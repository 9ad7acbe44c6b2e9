"""The checkpoint label protocol, in one place.

A label names a point of the loop (``VALIDATION_BATCH``) or an event (``OOM``,
``CHECK_FAILED``). ``*_START``/``*_END`` labels frame a phase; ``SESSION_*`` and ``TEST_*`` frame a
whole run, and a recorder's ``phase("session")`` writes them as ``session START``/``session END``.
Labels compare case- and separator-insensitively (``session START`` is ``SESSION_START``).
"""

from __future__ import annotations

import functools
import re
from typing import Protocol

TEST_START = "TEST_START"
TEST_END = "TEST_END"
SESSION_START = "SESSION_START"
SESSION_END = "SESSION_END"
EPOCH_END = "EPOCH_END"
OOM = "OOM"
CHECK_FAILED = "CHECK_FAILED"

START = "START"
END = "END"
"""The last words of a phase's first and last checkpoints (``validation START``)."""
RUN_STARTS = (SESSION_START, TEST_START)
RUN_ENDS = (SESSION_END, TEST_END)

_OOM_TEXT = re.compile(r"(?i:out of memory|\bcapacity\b.*\bexceeded\b)|\bOOM\b")
_OOM_TYPES = ("MemoryError", "OutOfMemoryError")


class Labelled(Protocol):
    """What the predicates below read: a sample's label, batch and note."""

    @property
    def label(self) -> str: ...
    @property
    def batch(self) -> int | None: ...
    @property
    def note(self) -> str | None: ...


@functools.lru_cache(maxsize=4096)
def canonical(label: str) -> str:
    """``session START`` -> ``SESSION_START`` (remembered: a run repeats a few labels)."""
    return label.upper().replace(" ", "_")


@functools.lru_cache(maxsize=4096)
def last_word(label: str) -> str:
    """``VALIDATION_START`` -> ``START``, ``session END`` -> ``END``."""
    return canonical(label).rsplit("_", 1)[-1]


def is_run_start(label: str) -> bool:
    return canonical(label) in RUN_STARTS


def is_run_end(label: str) -> bool:
    return canonical(label) in RUN_ENDS


def is_oom(sample: Labelled) -> bool:
    """An out-of-memory event: labelled ``OOM``, or a note that says so (an emulated capacity
    exceeded, a caught ``OutOfMemoryError``)."""
    return canonical(sample.label) == OOM or bool(sample.note and _OOM_TEXT.search(sample.note))


def is_check_failed(sample: Labelled) -> bool:
    return sample.label == CHECK_FAILED


def is_event(sample: Labelled) -> bool:
    """Something that happened (an OOM, a failed check), not a reading of the loop."""
    return is_oom(sample) or is_check_failed(sample)


def in_loop(sample: Labelled) -> bool:
    """A per-batch reading of a loop."""
    return sample.batch is not None and not is_event(sample)


def is_oom_error(error: BaseException | str) -> bool:
    """Whether what a run raised is an out-of-memory error."""
    if isinstance(error, BaseException):
        names = [c.__name__ for c in type(error).__mro__]
    else:  # "TypeName: message", as a timeline's end record keeps it
        names = [error.split(":", 1)[0].strip()]
    if any(n in _OOM_TYPES or n.endswith(("OOM", "OutOfMemory")) for n in names):
        return True
    return bool(_OOM_TEXT.search(str(error)))

"""The checkpoint label protocol, in one place.

A label names a point of the loop (``VALIDATION_BATCH``) or an event (``OOM``,
``CHECK_FAILED``). ``*_START``/``*_END`` labels frame a phase; ``SESSION_*`` and ``TEST_*`` frame a
whole run, and a recorder's ``phase("session")`` writes them as ``session START``/``session END``.
Labels compare case- and separator-insensitively (``session START`` is ``SESSION_START``).

A label is read once, where a sample is made: a sample keeps what happened at it (its
``event``, :func:`event_of`) and whether it opens or closes its phase (its ``edge``,
:func:`edge_of`) as fields, which everything after reads; a note's text decides nothing.
"""

from __future__ import annotations

import functools
import re
from typing import Protocol

from harness._core.errors import BadArgument, BadInput, Raised

TEST_START = "TEST_START"
TEST_END = "TEST_END"
SESSION_START = "SESSION_START"
SESSION_END = "SESSION_END"
EPOCH_END = "EPOCH_END"
OOM = "OOM"
CHECK_FAILED = "CHECK_FAILED"

EVENTS = (OOM, CHECK_FAILED)
"""What a sample's ``event`` may say happened at it."""

START = "START"
END = "END"
"""The last words of a phase's first and last checkpoints (``validation START``): a sample's
``edge``."""
RUN_STARTS = (SESSION_START, TEST_START)
RUN_ENDS = (SESSION_END, TEST_END)

_OOM_TEXT = re.compile(r"(?i:out of memory|\bcapacity\b.*\bexceeded\b)|\bOOM\b")
_OOM_TYPES = ("MemoryError", "OutOfMemoryError")


class Labelled(Protocol):
    """What :func:`is_oom` reads: a sample's event."""

    @property
    def event(self) -> str | None: ...


@functools.lru_cache(maxsize=4096)
def canonical(label: str) -> str:
    """``session START`` -> ``SESSION_START`` (remembered: a run repeats a few labels)."""
    return label.upper().replace(" ", "_")


@functools.lru_cache(maxsize=4096)
def last_word(label: str) -> str:
    """``VALIDATION_START`` -> ``START``, ``session END`` -> ``END``."""
    return canonical(label).rsplit("_", 1)[-1]


def event_of(label: str) -> str | None:
    """What a label says happened: ``OOM`` (any case or separator), ``CHECK_FAILED``, or
    nothing."""
    if reports_oom(label):
        return OOM
    return CHECK_FAILED if label == CHECK_FAILED else None


def given_event(label: object, event: object) -> str | None:
    """A checkpoint's event: ``event`` when it is one of :data:`EVENTS`, the label's when it is
    None; ``TypeError`` for anything else."""
    if event is None:
        return event_of(label) if type(label) is str else None
    if event not in EVENTS:
        raise BadArgument(f"checkpoint event: expected one of {EVENTS}, got {event!r}")
    return str(event)


def legacy_event(label: str, note: str | None) -> str | None:
    """What a sample of a timeline written before samples kept their event (formats 1 and 2)
    says happened: its label's event, else ``OOM`` where its note says the device ran out of
    memory (the recorder's own note on an emulated capacity, a caught error's text)."""
    found = event_of(label)
    if found is None and note is not None and _OOM_TEXT.search(note):
        return OOM
    return found


def edge_of(label: str) -> str | None:
    """``START`` or ``END`` for a label that opens or closes a phase, else None."""
    word = last_word(label)
    return word if word in (START, END) else None


def is_run_start(label: str) -> bool:
    return canonical(label) in RUN_STARTS


def is_run_end(label: str) -> bool:
    return canonical(label) in RUN_ENDS


def reports_oom(label: str) -> bool:
    """A label that reports an out-of-memory error (``OOM``, any case or separator), as a
    trainer does after the batch that failed; not a reading over the capacity."""
    return canonical(label) == OOM


def is_oom(sample: Labelled) -> bool:
    """An out-of-memory event: labelled ``OOM``, a checkpoint over an emulated capacity, or
    one its recorder was told is one."""
    return sample.event == OOM


def is_oom_error(error: BaseException | Raised | str) -> bool:
    """Whether what a run raised is an out-of-memory error: by its type (or a base of it), else
    by its message."""
    if isinstance(error, BaseException):
        names = [c.__name__ for c in type(error).__mro__]
        message = str(error)
    else:
        raised = Raised.of(error)
        names = [] if raised.type is None else [raised.type]
        message = raised.message
    if any(n in _OOM_TYPES or n.endswith(("OOM", "OutOfMemory")) for n in names):
        return True
    return bool(_OOM_TEXT.search(message))


MAX_TEXT = 256
"""Longest label or phase name a checkpoint takes."""
INDEX_LIMIT = 2**62
"""A checkpoint's epoch and batch are below this."""


def check_checkpoint(
    label: object, phase: object, epoch: object, batch: object, note: object
) -> None:
    """A :class:`~harness._core.errors.BadArgument` (a ``TypeError``), or a
    :class:`~harness._core.errors.BadInput` for absurd values, at the call for a checkpoint's bad
    arguments, before anything is recorded."""
    for name, value, optional in (("label", label, False), ("phase", phase, True)):
        if value is None and optional:
            continue
        if not isinstance(value, str):
            raise BadArgument(f"checkpoint {name}: expected a str, got {type(value).__name__}")
        if not value.strip() or len(value) > MAX_TEXT or "\x00" in value:
            raise BadInput(
                f"expected 1 to {MAX_TEXT} printable characters, got {value[:40]!r}",
                field=f"checkpoint {name}",
            )
    for name, value in (("epoch", epoch), ("batch", batch)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadArgument(f"checkpoint {name}: expected an int or None, got {value!r}")
        if not 0 <= value < INDEX_LIMIT:
            raise BadInput(f"expected 0 <= {name} < 2**62, got {value}", field=f"checkpoint {name}")
    if note is not None and not isinstance(note, str):
        raise BadArgument(f"checkpoint note: expected a str or None, got {type(note).__name__}")

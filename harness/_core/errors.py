"""leakgate's exceptions: one documented root and a few kinds that carry their facts.

Callers catch a class, never match a message: each exception keeps what it is about as
attributes (the file, the line, the field) and builds its one-line text from them once. The
front ends map the classes to exit codes in one place (``harness._frontends.cli``).

- :class:`LeakgateError`: the root of every error leakgate raises on purpose.
- :class:`BadInput`: a file, a field or other data that cannot be used (also a ``ValueError``,
  so code that caught the built-in still does).
- :class:`BadArgument`: an argument a function refuses, of the wrong type or the wrong value
  alike (a ``BadInput``, so a ``ValueError``, and a ``TypeError``); a reader that hands data
  from a file to such a function says the file instead (a plain ``BadInput``).
- :class:`UnwritableReport`: a report, verdict or timeline that could not be written (also an
  ``OSError``); what was written before is left as it was.
- :class:`AttributionFailed`: a warning, not an error: a recorder's attribution raised at a
  checkpoint, and the run went on without it (the test suite makes it an error).
- :class:`~harness._results.finish.MemoryCheckFailed` (beside the finished run it carries): a run
  whose memory verdict is not PASS, raised where a caller asked for an exception instead of a
  return value (also a ``RuntimeError``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


class LeakgateError(Exception):
    """The root of every error leakgate raises on purpose."""


class BadInput(LeakgateError, ValueError):
    """Input that cannot be used. ``problem`` says what is wrong; ``path``, ``line`` and
    ``field`` say where, when known, and lead the message: ``"run.json:3: rules: ..."``."""

    def __init__(
        self,
        problem: str,
        *,
        path: str | os.PathLike[str] | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.problem = problem
        self.path = None if path is None else os.fspath(path)
        self.line = line
        self.field = field
        super().__init__(self._text())

    def _text(self) -> str:
        where = self.path or ""
        if self.line is not None:
            where = f"{where}:{self.line}" if where else f"line {self.line}"
        lead = [part for part in (where, self.field) if part]
        return ": ".join([*lead, self.problem])

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only facts survive pickling (a rank's error sent to rank 0, an xdist worker's).
        return (_rebuild, (type(self), self.problem, self.path, self.line, self.field))


def _rebuild(
    cls: type[BadInput], problem: str, path: str | None, line: int | None, field: str | None
) -> BadInput:
    return cls(problem, path=path, line=line, field=field)


class BadArgument(BadInput, TypeError):
    """An argument a caller gave that a function cannot take, whether of the wrong type (a
    count that is not an int) or the wrong value (a negative one): API misuse, raised at the
    call (also a ``TypeError``, and a ``ValueError`` as bad input is)."""


@contextmanager
def refused_as_argument() -> Iterator[None]:
    """Bad input raised inside the block (by a check shared with readers of files, applied to a
    caller's argument) raised as a :class:`BadArgument`, its facts kept."""
    try:
        yield
    except BadArgument:
        raise
    except BadInput as exc:
        raise BadArgument(exc.problem, path=exc.path, line=exc.line, field=exc.field) from None


class UnwritableReport(LeakgateError, OSError):
    """A file leakgate had to write could not be written. ``path`` is the file, ``reason``
    the system's word for why (e.g. ``No space left on device``)."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"cannot write {self.path}: {reason}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.path, self.reason))


@dataclass(frozen=True)
class Raised:
    """What a run raised, as a timeline's end record keeps it: the error's ``type`` name (None
    for an error given as text) and the first line of its ``message``."""

    type: str | None
    message: str

    @classmethod
    def of(cls, error: BaseException | Raised | str) -> Raised:
        """An exception's type name and first line (its type name alone when it says nothing),
        or a text error's first line (``error`` when it is blank)."""
        if isinstance(error, Raised):
            return error
        if isinstance(error, BaseException):
            lines = str(error).strip().splitlines()
            return cls(type(error).__name__, lines[0] if lines else "")
        return cls(None, error.strip().splitlines()[0] if error.strip() else "error")

    def __str__(self) -> str:
        """``TypeName: message``, as a verdict shows it."""
        if self.type is None:
            return self.message
        return f"{self.type}: {self.message}" if self.message else self.type


class AttributionFailed(RuntimeWarning):
    """A recorder's attribution raised at the checkpoint ``label``; ``error`` is what it raised.
    The run goes on without that attribution, and the checkpoint's note says it failed."""

    def __init__(self, label: str, error: Raised) -> None:
        self.label = label
        self.error = error
        super().__init__(f"leakgate: attribution at {label!r} failed: {error}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.label, self.error))


def one_line(error: BaseException | str) -> str:
    """An error's first line of text: an exception's, else its class name; a text's, else
    ``error``. With its type name first, as verdicts and timelines show an error, it is
    ``str(Raised.of(error))``."""
    raised = Raised.of(error)
    return raised.message or raised.type or "error"


def as_bad_input(exc: ValueError) -> BadInput:
    """A reader's error as bad input: itself when it already is one (its facts kept)."""
    return exc if isinstance(exc, BadInput) else BadInput(one_line(exc))


def as_unwritable(exc: OSError, fallback: str | os.PathLike[str] | None) -> UnwritableReport:
    """A failed write as :class:`UnwritableReport`, naming the file it failed on."""
    if isinstance(exc, UnwritableReport):
        return exc
    return UnwritableReport(exc.filename or fallback or "", exc.strerror or str(exc))

"""leakgate's exceptions: one documented root and a few kinds that carry their facts.

Callers catch a class, never match a message: each exception keeps what it is about as
attributes (the file, the line, the field) and builds its one-line text from them once. The
front ends map the classes to exit codes in one place (``harness.cli``).

- :class:`LeakgateError`: the root of every error leakgate raises on purpose.
- :class:`BadInput`: a file, an argument or a field that cannot be used (also a ``ValueError``,
  so code that caught the built-in still does).
- :class:`UnwritableReport`: a report, verdict or timeline that could not be written (also an
  ``OSError``); what was written before is left as it was.
- :class:`MemoryCheckFailed`: a run whose memory verdict is not PASS, raised where a caller
  asked for an exception instead of a return value (also a ``RuntimeError``).
"""

from __future__ import annotations

import os
from typing import Any


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


class UnwritableReport(LeakgateError, OSError):
    """A file leakgate had to write could not be written. ``path`` is the file, ``reason``
    the system's word for why (e.g. ``No space left on device``)."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"cannot write {self.path}: {reason}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.path, self.reason))


class MemoryCheckFailed(LeakgateError, RuntimeError):
    """A run's memory verdict is not PASS and the caller asked for an exception (the Lightning
    callback's ``raise_on_fail=True``). ``finished`` holds the verdict, the holders named and the
    report's paths (:class:`harness.finish.Finished`); the message is its summary lines."""

    def __init__(self, finished: Any) -> None:
        super().__init__("\n".join(finished.lines()))
        self.finished = finished

    @property
    def verdict(self) -> Any:
        return self.finished.verdict


def one_line(exc: BaseException) -> str:
    """An exception's first line of text, else its class name."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def describe_error(error: BaseException | str) -> str:
    """``TypeName: first line of the message``, as verdicts and timelines keep an error."""
    if isinstance(error, BaseException):
        text = str(error).strip().splitlines()
        return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
    return error.strip().splitlines()[0] if error.strip() else "error"


def as_bad_input(exc: ValueError) -> BadInput:
    """A reader's error as bad input: itself when it already is one (its facts kept)."""
    return exc if isinstance(exc, BadInput) else BadInput(one_line(exc))


def as_unwritable(exc: OSError, fallback: str | os.PathLike[str] | None) -> UnwritableReport:
    """A failed write as :class:`UnwritableReport`, naming the file it failed on."""
    if isinstance(exc, UnwritableReport):
        return exc
    return UnwritableReport(exc.filename or fallback or "", exc.strerror or str(exc))

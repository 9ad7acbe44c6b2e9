"""The attribution at a recorder's checkpoints: made from what ``attribute=`` asks for, started
with the DataLoader workers' own search, and given each full reading, its failures seen.

An attribution that raises does not stop the run it explains: the reading is recorded without
it, :class:`~harness._core.errors.AttributionFailed` is warned (the test suite makes the warning
an error, so that a bug in attribution fails a test) and the reading's note says what it raised.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import TYPE_CHECKING

from harness._attribution.phase import PhaseAttribution
from harness._core.errors import AttributionFailed, BadArgument, Raised
from harness._measure.sample import Sample
from harness._timeline.store import make_sample

if TYPE_CHECKING:
    from harness._measure.children import ChildSampler
    from harness._verdict.options import Rules


def attribution_for(attribute: object, rules: Rules | None) -> PhaseAttribution:
    """The attribution ``attribute`` (anything but ``False``) asks a recorder for: a
    :class:`PhaseAttribution` as given, and for ``True`` one for ``rules`` (default rules) that
    also names holders at every phase's end; a :class:`BadArgument` for anything else."""
    if isinstance(attribute, PhaseAttribution):
        return attribute
    if attribute is not True:
        raise BadArgument(f"attribute: expected a bool or a PhaseAttribution, got {attribute!r}")
    from harness._verdict.options import Rules

    every_end = (
        Rules(attribute=True) if rules is None else dataclasses.replace(rules, attribute=True)
    )
    return PhaseAttribution.for_rules(every_end)


def started(
    attribution: PhaseAttribution, children: ChildSampler | None, rules: Rules | None
) -> str | None:
    """Start ``attribution`` and, where the ``children`` read publish into a heap board, the
    DataLoader workers' search of their own heaps past the children's budget of ``rules``: the
    board they name their holders in, or None."""
    attribution.start()
    board = children.reader.board if children is not None else None
    if board is None:
        return None
    from harness._attribution.worker_holders import watch_workers

    return board.path if watch_workers(board.path, rules) else None


def observe(attribution: PhaseAttribution, sample: Sample, stacklevel: int) -> tuple[bool, Sample]:
    """Let ``attribution`` act on ``sample``: whether it acted, and the sample to record. One
    that raises warns :class:`AttributionFailed` (``stacklevel`` as the caller would pass it to
    :func:`warnings.warn`), and the sample to record says so in its note."""
    try:
        return attribution.observe(sample), sample
    except Exception as error:
        raised = Raised.of(error)
        warnings.warn(AttributionFailed(sample.label, raised), stacklevel=stacklevel + 1)
        said = f"attribution failed: {raised}"
        note = f"{sample.note}; {said}" if sample.note else said
        return False, make_sample({**sample.__dict__, "note": note})

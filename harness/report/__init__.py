"""The markdown report of a run, and the directory's index of runs.

:func:`render_report` turns a :class:`Run` (timeline header, samples, verdict, attribution)
into the report; its sections live in :mod:`~harness.report.sections` (the frame),
:mod:`~harness.report.memory` (profile, chart, per-phase analysis) and
:mod:`~harness.report.issues` (findings with their cause and fix). :func:`index_lines` renders
``index.md`` from saved verdicts. Escaping is :mod:`harness.core.markdown`'s, advice
:mod:`harness.report.advice`'s.
"""

from __future__ import annotations

from harness.report.index import GateDecision, index_lines
from harness.report.run import Run, checkpoint_name, ended, epochs, oom_positions, unbatched
from harness.report.sections import render_report

__all__ = [
    "GateDecision",
    "Run",
    "checkpoint_name",
    "ended",
    "epochs",
    "index_lines",
    "oom_positions",
    "render_report",
    "unbatched",
]

"""Who holds leaked memory: the references that keep a phase's new tensors alive. A
:class:`Snapshot` (:func:`live_tensors`) notes what was alive before; :func:`attribute` names
what keeps each newer tensor by a bounded walk of the object graph from named roots
(:mod:`~harness.attribution.walk`), grouped into :class:`Holder` s
(:mod:`~harness.attribution.holders`), or, where those hold under half of a growth, by the
retained size of every new object at its accumulation point
(:mod:`~harness.attribution.retained`); :class:`PhaseAttribution` does this at a recorder's
checkpoints (:mod:`~harness.attribution.phase`) and :func:`explain` picks the holders for a
verdict's findings, :func:`shares` how much of each they hold
(:mod:`~harness.attribution.findings`); on CUDA, allocation sites come from torch's allocation
history (:mod:`~harness.attribution.sites`), and with the dearer search (``explain``) the lines
that allocated each storage and Python object, on any device (:mod:`~harness.attribution.lines`).
A search runs where no tracer or profiler records it, and steps aside under another memory
tracer (:mod:`~harness.attribution.quiet`).
"""

from harness.attribution.findings import Share, explain, hint, named, shares
from harness.attribution.holders import Holder, attribute
from harness.attribution.lines import Lines
from harness.attribution.phase import PhaseAttribution
from harness.attribution.sites import record_sites
from harness.attribution.snapshot import Snapshot, live_tensors

__all__ = [
    "Holder",
    "Lines",
    "PhaseAttribution",
    "Share",
    "Snapshot",
    "attribute",
    "explain",
    "hint",
    "live_tensors",
    "named",
    "record_sites",
    "shares",
]

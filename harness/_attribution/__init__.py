"""Who holds leaked memory: the references that keep a phase's new tensors alive.

A :class:`~harness._attribution.snapshot.Snapshot` notes what was alive before;
:func:`~harness._attribution.holders.attribute` names what keeps each newer tensor by a bounded
walk of the object graph from named roots (:mod:`~harness._attribution.walk`), grouped into
:class:`~harness._attribution.holder.Holder` s, or, where those hold under half of a growth, by
the retained size of every new object at its accumulation point
(:mod:`~harness._attribution.retained`). :class:`~harness._attribution.phase.PhaseAttribution`
does this at a recorder's checkpoints, and :mod:`~harness._attribution.findings` picks the
holders for a verdict's findings and how much of each they hold. On CUDA, allocation sites come
from torch's allocation history (:mod:`~harness._attribution.sites`), and with the dearer search
(``explain``) the lines that allocated each storage and Python object, on any device
(:mod:`~harness._attribution.lines`). A search runs where no tracer or profiler records it, and
steps aside under another memory tracer (:mod:`~harness._attribution.quiet`). Each name is
imported from the module that defines it.
"""

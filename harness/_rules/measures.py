"""What a run is judged on: the rules' metric, and each other place memory lives that the run
recorded, judged by the same rules beside it.

A job's memory lives in five places: the device's caching allocator, ``malloc``, Python's own
allocator, other libraries' pools and mappings, and the processes the job starts. The rules'
metric (``allocated``) is the live heap of the device the probe reads: on the CPU, ``malloc``,
Python's allocator and the pools together (:mod:`harness._measure.host`), their parts kept beside
it. Where a run recorded them, these are judged too:

- ``outside``: resident anonymous memory that no counter explains (a library's own ``mmap``, a
  pool without a counter), by ``max_growth`` and ``max_drift``, as its own finding kind;
- ``host_allocated`` and ``host_outside``: the host process beside a device that is not the
  host (a GPU), by ``max_growth``, ``project_to``, ``max_drift`` and ``teardown``;
- ``job``: the host's live heap and what every live child adds to it (its private memory when
  first read, and its own growth since), at the checkpoints outside loops, by ``max_drift``: a
  process that is new in a later epoch adds to the job's memory, idle or not.

Each is a :class:`Measure`: its metric, the rules that judge it, the finding kind and words its
findings carry, and the parts whose growth a finding names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness._core.units import format_size
from harness._measure.children import CHILDREN_COST, JOB
from harness._measure.host import HOST, PARTS, POOL
from harness._rules.sample_columns import Columns
from harness._verdict.model import Kind

LOOP_RULES = ("max_growth", "project_to")
OUTSIDE_FLOOR = 2 * 2**20
"""The least growth outside what leakgate reads that is judged (:attr:`Measure.floor`): clean
loops of the TFT moved it by up to 420 KiB here, and a clean trainer's epochs with workers under
``--memreport-explain`` by 1.0 MiB (explain's tables given back when it stops tracing)."""
RUN_RULES = ("max_drift", "teardown")


@dataclass(frozen=True)
class Measure:
    """One place a run is judged on: its ``metric``, the ``rules`` that judge it, the ``kind``
    of its findings, ``where`` it is (words after a leak's scope: ``on the host``), and the
    metrics whose growth a finding names as its ``parts`` (a prefix ends with ``_``)."""

    metric: str
    rules: tuple[str, ...] = LOOP_RULES + RUN_RULES
    kind: Kind = Kind.LEAK
    where: str = ""
    parts: tuple[str, ...] = ()
    floor: int = 0
    """The least growth judged at all, whatever the budget: what no counter explains is read by
    the page, and moves by hundreds of KiB in clean loops (a heap faulting back in the pages it
    had given back at a trim)."""
    confirms: tuple[tuple[str, ...], ...] = ()
    """For what no counter explains, the other series that must have grown past the budget too,
    each the first metric less the others. The measure itself (resident anonymous memory less
    what the allocators hold from the system) moves when a heap refills pages it had given back
    at a trim, or gives back pages it held but no longer had resident; resident anonymous memory
    less the live heap moves when an allocator keeps pages it freed; resident anonymous memory
    itself, when either grows. Memory outside every allocator moves all three."""

    def leak(self, scope: str) -> str:
        """How a finding of this measure begins: ``leak on the host in validation epoch 0``."""
        if self.kind == Kind.OUTSIDE:
            return f"growth outside what leakgate reads in {scope}"
        return f"leak{self.where} in {scope}"

    def drift(self, label: str) -> str:
        """How a drift of this measure begins."""
        if self.metric == JOB:
            return f"drift of the job's memory at {label}"
        if self.kind == Kind.OUTSIDE:
            return f"drift outside what leakgate reads at {label}"
        return f"drift{self.where} at {label}"


_LIVE_PARTS = (*PARTS, POOL)
OUTSIDE = Measure(
    "outside",
    ("max_growth", "max_drift"),
    Kind.OUTSIDE,
    parts=("anon", "allocated"),
    floor=OUTSIDE_FLOOR,
    confirms=(("anon", "allocated"), ("anon",)),
)
BESIDE = (
    OUTSIDE,
    Measure(HOST + "allocated", where=" on the host", parts=tuple(HOST + p for p in _LIVE_PARTS)),
    Measure(
        HOST + "outside",
        ("max_growth", "max_drift"),
        Kind.OUTSIDE,
        " on the host",
        (HOST + "anon", HOST + "allocated"),
        OUTSIDE_FLOOR,
        ((HOST + "anon", HOST + "allocated"), (HOST + "anon",)),
    ),
    Measure(JOB, ("max_drift",), parts=("allocated", HOST + "allocated", CHILDREN_COST)),
)
"""The measures judged beside the rules' metric, where a run recorded them."""
PRIMARY_PARTS = _LIVE_PARTS
"""The parts of the rules' metric on the CPU (its live heap)."""
NAMES = {
    "malloc": "malloc",
    "python": "Python objects",
    "anon": "anon",
    "allocated": "allocated",
    CHILDREN_COST: "children",
}


def primary(rules_metric: str) -> Measure:
    """The measure of the rules' metric itself."""
    parts = PRIMARY_PARTS if rules_metric == "allocated" else ()
    return Measure(rules_metric, parts=parts)


def beside(columns: Columns, host: bool) -> list[Measure]:
    """The measures of :data:`BESIDE` that ``columns`` hold readings of (the host's only with
    ``host``)."""
    found = []
    for m in BESIDE:
        wanted = host or not m.metric.startswith(HOST)
        lived = m.metric != JOB or columns.present(CHILDREN_COST).any()  # children lived
        if wanted and lived and columns.present(m.metric).any():
            found.append(m)
    return found


def part_name(metric: str) -> str:
    """A part's name in a finding: ``Python objects``, ``pyarrow pool``, ``host malloc``."""
    host = metric.startswith(HOST)
    bare = metric[len(HOST) :] if host else metric
    name = f"{bare[len(POOL) :]} pool" if bare.startswith(POOL) else NAMES.get(bare, bare)
    return f"host {name}" if host else name


def part_metrics(measure: Measure, metrics: Sequence[str]) -> list[str]:
    """The metrics among ``metrics`` that are ``measure``'s parts, in its order."""
    found = []
    for part in measure.parts:
        if part.endswith("_"):
            found += sorted(m for m in metrics if m.startswith(part))
        elif part in metrics:
            found.append(part)
    return found


def parts_grown(measure: Measure, columns: Columns, first: int, last: int) -> str:
    """What each part of ``measure`` grew by between positions ``first`` and ``last``, largest
    first: ``Python objects +5.5MiB, malloc +1.5MiB`` (empty where it has none read at both)."""
    grown = []
    for metric in part_metrics(measure, columns.metric_names):
        present = columns.present(metric)
        if present[first] and present[last]:
            values = columns.values(metric)
            grown.append((float(values[last] - values[first]), metric))
    if grown:
        floor = max(abs(g) for g, _ in grown) / 100  # parts that barely moved are left out
        grown = [(g, m) for g, m in grown if abs(g) > floor]
    grown.sort(key=lambda g: -g[0])
    return ", ".join(f"{part_name(m)} {format_size(g, signed=True)}" for g, m in grown)


def shown_parts(rules_metric: str, metrics: Sequence[str]) -> list[str]:
    """The places a report shows beside the rules' metric, of ``metrics``: the live heap's
    parts, then each measure judged beside it with its own parts (the job's, read at phase
    edges only, left to its findings)."""
    shown = part_metrics(primary(rules_metric), metrics)
    for measure in BESIDE:
        if measure.metric != JOB and measure.metric in metrics:
            shown.append(measure.metric)
            if measure.kind == Kind.LEAK:  # a live heap beside: its parts too
                shown += part_metrics(measure, metrics)
    return shown

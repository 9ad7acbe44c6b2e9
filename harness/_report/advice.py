"""What the report says a finding's root cause is and how to fix it.

The text comes from two tables, :data:`CAUSES` and :data:`FIXES`, looked up by the finding's
kind and by facts taken from the verdict's typed fields (:class:`Facts`): the re-check's
``outcome`` of a leak, whether a leak was found in the same phase and epoch, whether memory
holders were found and whether the first one has a name. A finding's message is never read,
so rewording a rule's message cannot change the advice. The first matching row wins; its
template is filled with markdown that the caller has already escaped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from harness._verdict.model import Finding, Kind, Outcome


class _Any:
    """Matches any value of a :class:`Facts` field."""

    def __repr__(self) -> str:
        return "ANY"


ANY: Final = _Any()


@dataclass(frozen=True)
class Facts:
    """What advice is chosen by."""

    kind: str
    outcome: Outcome | None = None
    leak_beside: bool = False
    held: bool = False
    named: bool = False

    @classmethod
    def of(cls, finding: Finding, findings: Sequence[Finding], *, held: bool, named: bool) -> Facts:
        """The facts of ``finding`` among the verdict's ``findings``; ``held`` and ``named``
        say whether holders were found for it and whether the first has a path."""
        return cls(finding.kind, finding.outcome, leak_beside(finding, findings), held, named)


@dataclass(frozen=True)
class Row:
    """One row of an advice table: a kind (``None`` for any), conditions, and a template.

    Templates may use ``{phase}``, ``{holders}`` (who holds the memory), ``{holder}`` (the
    first holder's path, as code), ``{size}`` (the finding's bytes) and ``{inference}`` (a
    hint that applies to validation loops only).
    """

    kind: Kind | None
    text: str
    outcome: Outcome | _Any | None = ANY
    leak_beside: bool | _Any = ANY
    held: bool | _Any = ANY
    named: bool | _Any = ANY

    def matches(self, facts: Facts) -> bool:
        wanted = (
            (self.outcome, facts.outcome),
            (self.leak_beside, facts.leak_beside),
            (self.held, facts.held),
            (self.named, facts.named),
        )
        kind_ok = self.kind is None or self.kind == facts.kind
        return kind_ok and all(want is ANY or want == have for want, have in wanted)


_RELEASED_LOOP = (
    "kept from batch to batch inside the {phase} loop and released only when the phase "
    "ended: a per-batch cache or list (outputs, attention tensors, losses kept with their "
    "graph) cleared after the loop instead of inside it."
)
_KEEP_DETACHED = (
    "inside the loop, every batch, not after it; keep only detached values (`.detach()`, "
    "`.item()`) across batches{inference}."
)
_LOWER_FOOTPRINT = (
    "lower the step's footprint (batch size, optimizer state released before validation, "
    "no graphs kept) until the phase fits the capacity."
)

CAUSES: tuple[Row, ...] = (
    Row(Kind.LEAK, "Memory {holders}, " + _RELEASED_LOOP, Outcome.RELEASED, held=True),
    Row(Kind.LEAK, "Memory " + _RELEASED_LOOP, Outcome.RELEASED),
    Row(
        Kind.LEAK,
        "Memory added by every {phase} batch and still held after the phase and a full "
        "collection: a long-lived reference (an attribute, a global, a cache) keeps it.",
        Outcome.RETAINED,
        held=False,
    ),
    Row(None, "Memory {holders}.", held=True),
    Row(
        Kind.LEAK,
        "Memory added by every {phase} batch and not released within the loop (outputs, "
        "losses or caches kept across batches).",
    ),
    Row(
        Kind.PEAK,
        "The growth reported as a leak in this phase: the {phase} loop's memory rose batch "
        "by batch to this peak.",
        leak_beside=True,
    ),
    Row(
        Kind.PEAK,
        "One {phase} batch needed {size} above the phase's start: a bigger batch than the "
        "others (check the batch size this phase really uses) or an unusually large input.",
    ),
    Row(
        Kind.DRIFT,
        "Memory added once per epoch and never released: state that accumulates across "
        "epochs (a history of tensors, optimizer state, saved checkpoints kept in memory).",
    ),
    Row(
        Kind.TEARDOWN,
        "A reference that outlives the session keeps memory alive: a second strong reference "
        "to the model, its parameters or the optimizer (a global, a class attribute, a "
        "callback, a closure).",
    ),
    Row(Kind.CHECK, "A trainer invariant did not hold; the evidence above names it."),
    Row(
        Kind.OOM,
        "The leak found in this phase filled the device: the {phase} loop kept memory batch "
        "by batch until a step could not get more.",
        leak_beside=True,
    ),
    Row(
        Kind.OOM,
        "The {phase} step needed more memory than the device has; a leak or peak above says "
        "what filled it, else the step's own footprint (batch size, retained optimizer state, "
        "activations) is too large.",
    ),
    Row(
        Kind.FRAGMENTATION,
        "The caching allocator reserves blocks it cannot reuse (tensor shapes that vary from "
        "batch to batch).",
    ),
    Row(
        Kind.CHILD_LEAK,
        "A child process allocates memory with every {phase} batch and keeps it: in a "
        "DataLoader worker, a dataset or `collate_fn` that caches what it makes (items, "
        "decoded samples, tensors) inside the worker, where the training process cannot see "
        "it; in another child, its own state.",
    ),
    Row(
        Kind.COPY_ON_READ,
        "Copy-on-read: the workers read a dataset of Python objects (lists, dicts, strings) "
        "that the parent built before forking them; every read writes the objects' reference "
        "counts, so each worker slowly copies the pages it touches, up to the whole dataset "
        "per worker. No memory is leaked, but it is multiplied by the number of workers.",
    ),
    Row(
        Kind.OUTSIDE,
        "Memory grows that no allocator leakgate reads accounts for: a library's own mappings "
        "(`mmap`, a pool without a counter, a native extension's buffers) kept with every "
        "{phase} batch.",
    ),
    Row(
        Kind.PROFILER,
        "A torch profiler recorded the {phase} loop: its events ({size}) live in C++ until it "
        "stops, and it stopped before the run ended, so they are its own and not a leak.",
    ),
    Row(None, "See the evidence above."),
)

FIXES: tuple[Row, ...] = (
    Row(Kind.LEAK, "Clear {holder} " + _KEEP_DETACHED, named=True),
    Row(Kind.LEAK, "Clear what the loop keeps " + _KEEP_DETACHED),
    Row(Kind.PEAK, "Fix the leak in this phase; the peak goes with it.", leak_beside=True),
    Row(
        Kind.PEAK,
        "Make the phase use the batch size you meant (no hard-coded override in the CLI or "
        "config), or split the large input; set `max_peak` to what one batch may use.",
    ),
    Row(
        Kind.DRIFT,
        "Release per-epoch state before the next epoch: store metrics as Python numbers, "
        "free or offload optimizer state as intended, drop references to saved checkpoints.",
    ),
    Row(
        Kind.TEARDOWN,
        "Drop {holder} when the session ends (or hold it weakly), so that the model, its "
        "parameters and the optimizer state can be freed.",
        named=True,
    ),
    Row(
        Kind.TEARDOWN,
        "Drop the extra reference when the session ends (or hold it weakly), so that the "
        "model, its parameters and the optimizer state can be freed.",
    ),
    Row(Kind.OOM, "First clear {holder} inside the loop; then " + _LOWER_FOOTPRINT, named=True),
    Row(Kind.OOM, "First fix the leak or peak above; then " + _LOWER_FOOTPRINT),
    Row(
        Kind.FRAGMENTATION,
        "Keep tensor shapes stable (pad to fixed sizes), or set "
        "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`.",
    ),
    Row(Kind.CHECK, "Restore the invariant the check names, then keep the check in the run."),
    Row(
        Kind.CHILD_LEAK,
        "Do not keep per-item results in the dataset or in globals of the worker; bound any "
        "cache (an LRU of fixed size) or build it once in the parent before the workers start.",
    ),
    Row(
        Kind.COPY_ON_READ,
        "Keep the dataset in storage without per-item Python objects: numpy arrays, a pyarrow "
        "table, or tensors (one buffer each, whose pages are never written by a read), or "
        "load items lazily from files inside the workers.",
    ),
    Row(
        Kind.OUTSIDE,
        "Find what maps or pools memory each batch outside Python and malloc (run the loop "
        "under `memray run --native`, or compare `/proc/<pid>/smaps` at two batches) and "
        "release it each batch, or bound it.",
    ),
    Row(
        Kind.PROFILER,
        "Nothing to fix; profile fewer batches (a `schedule`) to keep its events smaller. A "
        "profiler left recording when the run ends is judged a leak.",
    ),
    Row(None, "Act on the evidence above."),
)


def lookup(table: Sequence[Row], facts: Facts) -> Row:
    """The first row of ``table`` that matches ``facts`` (every table ends with a catch-all)."""
    return next(row for row in table if row.matches(facts))


def advise(
    finding: Finding,
    findings: Sequence[Finding],
    *,
    phase: str,
    size: str,
    holders: str = "",
    holder: str = "",
) -> tuple[str, str]:
    """The root cause and the fix for ``finding``. ``phase``, ``size``, ``holders`` (who holds
    the memory, empty when nobody was found) and ``holder`` (the first holder's path as code,
    empty when it has none) are markdown, filled into the templates as they are."""
    facts = Facts.of(finding, findings, held=bool(holders), named=bool(holder))
    fields = {
        "phase": phase,
        "size": size,
        "holders": holders,
        "holder": holder,
        "inference": ", and validate under `torch.inference_mode()`"
        if finding.phase == "validation"
        else "",
    }
    return lookup(CAUSES, facts).text.format(**fields), lookup(FIXES, facts).text.format(**fields)


def leak_beside(finding: Finding, findings: Sequence[Finding]) -> bool:
    """Whether a leak was found in ``finding``'s phase and epoch (other than ``finding``)."""
    place = (finding.phase, finding.epoch)
    return any(
        f.kind == Kind.LEAK and f is not finding and (f.phase, f.epoch) == place for f in findings
    )

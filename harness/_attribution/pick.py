"""Which holders to name, by one rule for every caller (a phase's budget crossed and its end, an
OOM, a drift between epochs, a DataLoader worker's own heap, a finding explained afterwards):

1. the new tensors' holders, each named by its nearest named reference (:func:`~harness.
   attribution.holders.attribute`: cheap, it stops once it has reached every new tensor);
2. where the largest of them holds under :data:`MOST` of a growth of :data:`RETAINED_FROM` or
   more, and the caller has a census of every object alive before the growth, the dominator
   tree by retained size over everything made since (:func:`~harness._attribution.retained.
   retained_holders`), whose holders replace the first ones where the largest of them holds
   more: the accumulation point (the list of 176 batches, the list that keeps every epoch's
   optimizer) rather than the pieces it keeps;
3. where the Python holders chosen still hold under half of the growth, what torch keeps in C++
   while a feature is on (a recording profiler) names the rest
   (:func:`~harness._attribution.torch_state.torch_holders`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from harness._attribution.holder import Holder
from harness._attribution.lines import PYTHON_OBJECTS
from harness._attribution.torch_state import torch_holders

RETAINED_FROM = 2**19
"""Growth below which no object is weighed: a walk of every object costs a second or two and
leaves the interpreter's small-object arenas larger (tens of MiB of resident memory on a
training process), a price worth paying for a leak of half a MiB or more, not for noise."""
MOST = 0.75
"""The share of a growth one holder must keep to be the answer without a search by retained
size: less, and the pieces named (one epoch's optimizer of several, one batch's list of many)
may share an accumulation point further up."""
_UNNAMED = ("<", PYTHON_OBJECTS)


def named_bytes(holders: Sequence[Holder]) -> int:
    """What the named holders among ``holders`` keep (``<unnamed ...>``, ``<outside Python>``,
    a line's Python objects and a search that stepped aside name no holder)."""
    return sum(h.bytes for h in holders if not h.path.startswith(_UNNAMED))


def _largest(holders: Sequence[Holder]) -> int:
    return max((h.bytes for h in holders if not h.path.startswith(_UNNAMED)), default=0)


def pick(
    found: list[Holder],
    growth: int | None,
    by_retained: Callable[[], list[Holder]] | None = None,
    *,
    cpp: bool = True,
) -> list[Holder]:
    """The holders to name for ``growth`` (see the module's doc): ``found`` by the tensors'
    search, or what ``by_retained`` (the search by retained size, called only where the rule
    asks for it; None where the caller has no census or may search no more) returns where its
    largest holder holds more; then, with ``cpp``, torch's C++ holders for what the Python
    holders leave unexplained."""
    chosen = found
    if by_retained is not None and growth is not None and growth >= RETAINED_FROM:
        top = _largest(found)
        if top < MOST * growth:
            better = by_retained()
            if _largest(better) > top:
                chosen = better
    if not cpp or growth is None:
        return chosen
    held = named_bytes(chosen)
    return chosen + torch_holders(growth - held) if 2 * held < growth else chosen

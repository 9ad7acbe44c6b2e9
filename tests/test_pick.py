"""The one rule that picks which holders to name (harness/_attribution/pick.py), for every
caller."""

from __future__ import annotations

from harness._attribution.holder import Holder
from harness._attribution.pick import MOST, RETAINED_FROM, named_bytes, pick

MiB = 2**20


def _held(path: str, size: int) -> Holder:
    return Holder(path, "list", 1, 0, size)


class _Search:
    """A search by retained size that counts its calls."""

    def __init__(self, found: list[Holder]) -> None:
        self.found, self.calls = found, 0

    def __call__(self) -> list[Holder]:
        self.calls += 1
        return self.found


def test_one_holder_that_keeps_most_of_the_growth_is_the_answer_without_weighing() -> None:
    found = [_held("Cache.items", int(MOST * 4 * MiB))]
    search = _Search([_held("Everything.kept", 4 * MiB)])
    assert pick(found, 4 * MiB, search) == found
    assert search.calls == 0


def test_pieces_of_one_accumulation_point_are_replaced_by_it() -> None:
    """Two epochs' copies, each half of a drift: the list that keeps both is named."""
    found = [_held("Keeper.copies[0]", 2 * MiB), _held("Keeper.copies[1]", 2 * MiB)]
    search = _Search([_held("Keeper.copies", 4 * MiB)])
    assert pick(found, 4 * MiB, search) == search.found
    assert search.calls == 1


def test_a_search_by_retained_size_that_finds_no_larger_holder_changes_nothing() -> None:
    found = [_held("a.x", 2 * MiB), _held("b.y", 2 * MiB)]
    search = _Search([_held("a.x", 2 * MiB)])
    assert pick(found, 4 * MiB, search) == found
    assert search.calls == 1


def test_growth_under_the_threshold_or_without_a_census_is_never_weighed() -> None:
    search = _Search([_held("Everything.kept", MiB)])
    assert pick([], RETAINED_FROM - 1, search) == []
    assert pick([], None, search) == []
    assert search.calls == 0
    assert pick([], 4 * MiB, None) == []


def test_unnamed_holders_count_for_nothing() -> None:
    found = [_held("<outside Python>", 4 * MiB)]
    search = _Search([_held("Keeper.copies", 3 * MiB)])
    assert named_bytes(found) == 0
    assert pick(found, 4 * MiB, search) == search.found

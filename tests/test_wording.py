"""Counts in words: singular for one, plural otherwise."""

from harness._core.wording import plural


def test_one_is_singular_and_any_other_count_plural():
    assert [plural(n, "item") for n in (0, 1, 2)] == ["0 items", "1 item", "2 items"]
    assert plural(1, "batch", "batches") == "1 batch"
    assert plural(3, "batch", "batches") == "3 batches"

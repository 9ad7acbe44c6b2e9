"""Counts in words: a number with its noun, singular for one and plural otherwise."""

from __future__ import annotations


def plural(n: int, noun: str, many: str | None = None) -> str:
    """``1 item``, ``2 items``, ``0 items``; ``many`` for a noun whose plural is not ``noun + s``
    (``plural(2, "batch", "batches")``)."""
    return f"{n} {noun if n == 1 else many or noun + 's'}"

"""Markdown building blocks for the report and the index: one-line text, table rows, fenced
blocks, inline code and relative links. Every piece of text that did not come from leakgate
itself goes through one of these before it reaches a markdown file.
"""

from __future__ import annotations

from collections.abc import Sequence


def line(text: object) -> str:
    """One line of text: whitespace runs (newlines included) become single spaces."""
    return " ".join(str(text).split())


def cell(text: str) -> str:
    """A table cell: one line, pipes escaped, never empty."""
    return line(text).replace("|", "\\|") or " "


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A pipe table: the header, its delimiter row, then one line per row."""

    def cells(values: Sequence[str]) -> str:
        return "| " + " | ".join(cell(v) for v in values) + " |"

    return [cells(header), "|" + "|".join("---" for _ in header) + "|", *map(cells, rows)]


def fenced(language: str, body: Sequence[str]) -> list[str]:
    """A fenced block longer than any run of backticks in ``body``."""
    fence = "`" * max(3, longest_backticks(body) + 1)
    return [f"{fence}{language}", *body, fence]


def longest_backticks(lines: Sequence[str]) -> int:
    """The longest run of backticks in any of ``lines``."""
    best = 0
    for text in lines:
        count = 0
        for char in text:
            count = count + 1 if char == "`" else 0
            best = max(best, count)
    return best


def code(text: str) -> str:
    """``text`` as inline code, or as is when it holds a backtick."""
    return f"`{text}`" if "`" not in text else text


def link(path: str) -> str:
    """A relative path as a link target: spaces and parentheses percent-encoded."""
    return path.replace(" ", "%20").replace("(", "%28").replace(")", "%29")

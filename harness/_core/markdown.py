"""Markdown that stays inert whatever text it is given: the one escaping family the report and
the index use (they end up in GitHub job summaries). Text from outside leakgate (test ids,
phases, labels, notes, errors, holder paths, titles, header values) reaches markdown only
through :func:`text` (running text, headings, table cells), :func:`code` (inline code),
:func:`fenced` (code blocks), :func:`link_to` (links to our own files) or :func:`mermaid`
(chart labels); each makes it one line, replaces control and bidirectional-override characters
with U+FFFD and cuts absurd lengths with an ellipsis (:func:`plain`), and returns a
:class:`Markdown` string, which :func:`table` passes through while it escapes any other ``str``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from urllib.parse import quote

LIMIT = 300
"""Characters kept of one piece of outside text, unless a caller asks for another cap."""
ELLIPSIS = "\u2026"
_UNSAFE = re.compile(
    "[\x00-\x08\x0e-\x1f\x7f-\x84\x86-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)
_BREAKS = re.compile("[\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")
_SPECIAL = frozenset("\\`*[]<>&|~$")
_MERMAID = str.maketrans(
    {"#": "#35;", '"': "#quot;", "<": "#lt;", ">": "#gt;", "`": "#96;", ";": "#59;"}
)


class Markdown(str):
    """Text that is markdown already: escaped outside text, or leakgate's own markup."""

    __slots__ = ()


def plain(value: object, limit: int = LIMIT) -> str:
    """``value`` as one line of at most ``limit`` characters, not escaped: whitespace runs
    (newlines included) become one space, control, bidirectional-override and lone surrogate
    characters become U+FFFD, and a longer text ends in an ellipsis."""
    raw = value if isinstance(value, str) else str(value)
    cut = len(raw) > 4 * limit + 64
    if cut:
        raw = raw[: 4 * limit + 64]
    one = _UNSAFE.sub("\ufffd", " ".join(raw.split()))
    if cut or len(one) > limit:
        one = one[: max(limit - 1, 0)].rstrip() + ELLIPSIS
    return one


line = plain
"""The former name of :func:`plain`."""


def text(value: object, limit: int = LIMIT) -> Markdown:
    """Outside text for running text, a heading or a table cell: :func:`plain`, then every
    character that could start markup escaped (backslash, backtick, ``*``, brackets, angle
    brackets, ``&``, pipe, ``~``, ``$``; ``_`` unless inside a word; ``#`` at
    either end). It renders as the same characters, never as a link, an image, HTML, code,
    emphasis, a heading or another table cell."""
    one = plain(value, limit)
    out: list[str] = []
    last = len(one) - 1
    for i, char in enumerate(one):
        if char in _SPECIAL:
            out.append("\\" + char)
        elif char == "_":
            out.append(char if _inside_word(one, i) else "\\_")
        elif char == "#" and (i == 0 or i == last):
            out.append("\\#")
        else:
            out.append(char)
    return Markdown("".join(out))


def _inside_word(one: str, i: int) -> bool:
    """Whether the run of underscores at ``i`` has a letter or digit on both sides: such a
    run can neither open nor close emphasis."""
    start = end = i
    while start > 0 and one[start - 1] == "_":
        start -= 1
    while end < len(one) - 1 and one[end + 1] == "_":
        end += 1
    return start > 0 and end < len(one) - 1 and one[start - 1].isalnum() and one[end + 1].isalnum()


def code(value: object, limit: int = LIMIT) -> Markdown:
    """Outside text as inline code, fenced by more backticks than it holds. Text with a pipe
    is given as :func:`text` instead, since a pipe would end a table cell even inside code."""
    one = plain(value, limit)
    if not one or "|" in one:
        return text(one, limit)
    fence = "`" * (_longest_run(one, "`") + 1)
    pad = " " if one.startswith("`") or one.endswith("`") else ""
    return Markdown(f"{fence}{pad}{one}{pad}{fence}")


def spans(value: object, limit: int = LIMIT) -> Markdown:
    """A sentence of leakgate's own with outside values in it: the parts between paired
    backticks as inline code (:func:`code`), the rest as :func:`text`; with an unpaired
    backtick, all of it as text."""
    one = plain(value, limit)
    parts = one.split("`")
    if len(parts) % 2 == 0:
        return text(one, limit)
    out: list[str] = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(code(part))
            continue
        lead = " " if part.startswith(" ") else ""
        trail = " " if part.endswith(" ") and part.strip() else ""
        out.append(lead + text(part) + trail)
    return Markdown("".join(out))


def strong(value: object) -> Markdown:
    """Bold: markdown kept as it is, anything else escaped as :func:`text`."""
    inner = value if isinstance(value, Markdown) else text(value)
    return Markdown(f"**{inner}**")


def heading(level: int, value: object) -> Markdown:
    """An ATX heading line of ``level`` (1-6); its title escaped unless it is markdown."""
    title = value if isinstance(value, Markdown) else text(value)
    return Markdown(f"{'#' * min(max(level, 1), 6)} {title}")


def cell(value: str) -> Markdown:
    """A table cell: markdown as it is (on one line), anything else as :func:`text`; never
    empty."""
    content = Markdown(" ".join(value.split())) if isinstance(value, Markdown) else text(value)
    return content or Markdown(" ")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A pipe table: the header, its delimiter row, then one line per row; cells through
    :func:`cell`."""

    def cells(values: Sequence[str]) -> str:
        return "| " + " | ".join(cell(v) for v in values) + " |"

    return [cells(header), "|" + "|".join("---" for _ in header) + "|", *map(cells, rows)]


def fenced(language: str, body: Sequence[str], limit: int = 4 * LIMIT) -> list[str]:
    """A fenced code block around ``body``, its fence longer than any run of backticks inside.
    Each line keeps its spacing; line breaks inside one become spaces, unsafe characters
    U+FFFD (as in :func:`plain`), and it is cut at ``limit`` characters."""
    lines = [_block_line(b, limit) for b in body]
    fence = "`" * max(3, max((_longest_run(b, "`") for b in lines), default=0) + 1)
    return [f"{fence}{plain(language, 20).replace('`', '')}", *lines, fence]


def link(path: str) -> str:
    """A relative path as a link target: percent-encoded, so it has no scheme, no spaces or
    brackets; a leading ``/`` becomes ``./``, so it never leaves the report's folder by
    naming a host."""
    target = quote(plain(path, 4 * LIMIT), safe="/")
    return "./" + target.lstrip("/") if target.startswith("/") else target


def link_to(label: object, path: str) -> Markdown:
    """A link to one of our files: its label escaped, its target from :func:`link`."""
    return Markdown(f"[{text(label)}]({link(path)})")


def mermaid(value: object, limit: int = 80) -> str:
    """Outside text for a double-quoted Mermaid string: quotes, angle brackets, backticks,
    ``#`` and ``;`` as Mermaid's entity codes."""
    return plain(value, limit).translate(_MERMAID)


def _block_line(value: str, limit: int) -> str:
    raw = value[: limit + 1]
    one = _UNSAFE.sub("\ufffd", _BREAKS.sub(" ", raw)).rstrip()
    return one if len(value) <= limit else one[: max(limit - 1, 0)] + ELLIPSIS


def _longest_run(line: str, char: str) -> int:
    best = count = 0
    for c in line:
        count = count + 1 if c == char else 0
        best = max(best, count)
    return best

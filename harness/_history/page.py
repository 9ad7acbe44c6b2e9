"""``leakgate history``: one markdown page of a history, read as series (one per test, machine
fingerprint and metric: never two machines in one series).

The page has, first, a table of the series whose memory moved (steps, each at its commit, and
a creep by the default rule), then a Mermaid chart per series across its last commits: peak
and growth, one value a commit (the median of its runs).
"""

from __future__ import annotations

import datetime
import math
import os
from pathlib import Path

import numpy as np

from harness._core.errors import BadInput
from harness._core.fsio import write_output
from harness._core.markdown import Markdown, code, heading, mermaid, table, text
from harness._core.units import format_size
from harness._core.wording import plural
from harness._history.archive import History, history_around, scan
from harness._history.creep import (
    DEFAULT_CREEP,
    Commits,
    CreepLimit,
    by_commit,
    creep,
    point_text,
    steps,
)
from harness._history.series import VALUES, HistorySeries, Selection, read_series

_MIB = 2**20
PAGE_WINDOW = 100
"""The runs of each series a page reads (the newest)."""
CHART_COMMITS = 50
"""The commits a chart shows (the newest)."""


def since_time(history: History, given: str) -> int:
    """``--since``: a date (``2026-05-01``, or an ISO time) or a commit (a prefix of at least
    four hex digits), as microseconds since the epoch: the first run of that commit. ``BadInput``
    for neither, or a commit the history never ran."""
    try:
        when = datetime.datetime.fromisoformat(given)
    except ValueError:
        when = None
    if when is not None:
        when = when if when.tzinfo else when.replace(tzinfo=datetime.UTC)
        return int(when.timestamp() * 1e6)
    if len(given) < 4 or any(c not in "0123456789abcdef" for c in given.lower()):
        raise BadInput(f"expected a date (2026-05-01) or a commit, got {given!r}", field="--since")
    import pyarrow as pa
    import pyarrow.compute as pc

    first: int | None = None
    for batch in scan(history, ("commit", "time")):
        commits = batch.column("commit").dictionary_decode()
        hits = pc.starts_with(commits, given.lower()).fill_null(False)
        times = pc.cast(batch.column("time"), pa.int64()).filter(hits)
        if len(times):
            low = int(pc.min(times).as_py())
            first = low if first is None else min(first, low)
    if first is None:
        raise BadInput(f"no run of commit {given} in the history", field="--since")
    return first


def render_page(history: History, selection: Selection, *, window: int = PAGE_WINDOW) -> str:
    """The page's markdown."""
    series = read_series(history, selection, window=window)
    limit = CreepLimit.parse(DEFAULT_CREEP)
    lines = [heading(1, "leakgate memory history"), ""]
    chosen = [f"tests matching {code(selection.test)}"] if selection.test else []
    chosen += [f"metric {code(selection.metric)}"] if selection.metric else []
    if selection.since is not None:
        at = datetime.datetime.fromtimestamp(selection.since / 1e6, datetime.UTC)
        chosen.append(f"runs since {at:%Y-%m-%d %H:%M} UTC")
    machines = {s.fingerprint for s in series}
    lines.append(
        f"{plural(len({s.test for s in series}), 'test')} on "
        f"{plural(len(machines), 'machine fingerprint')}, "
        f"{plural(len(series), 'series', 'series')} "
        f"(a test on one machine, one metric: runs of different machines are never one series), "
        f"each its last {window} runs" + (f"; {', '.join(chosen)}" if chosen else "") + "."
    )
    moved, charts = [], []
    for s in series:
        commits = {name: by_commit(s.commits, s.values(name), s.times) for name in VALUES}
        for name, c in commits.items():
            row = _moved(s, name, c, limit)
            if row is not None:
                moved.append(row)
        charts += _chart(s, commits)
    lines += ["", heading(2, "Moved"), ""]
    if moved:
        lines += table(
            ["test", "machine", "metric", "value", "steps (commit: change)", "creep"], moved
        )
    else:
        lines.append("No series stepped or crept.")
    lines += ["", heading(2, "HistorySeries"), "", *charts]
    return "\n".join(lines) + "\n"


def _moved(s: HistorySeries, name: str, c: Commits, limit: CreepLimit) -> list[str] | None:
    found = steps(c, min_bytes=_MIB)
    crept = creep(c, limit, min_bytes=_MIB)
    if not found and not crept.crept:
        return None
    said = []
    for at in found:
        before, after = float(np.median(c.values[:at])), float(np.median(c.values[at:]))
        share = f" ({(after - before) / abs(before):+.0%})" if before else ""
        said.append(f"{code(_short(c, at))}: {format_size(after - before, signed=True)}{share}")
    creeping = ""
    if crept.crept:
        share = f"{(crept.last - crept.first) / abs(crept.first):+.0%} " if crept.first else ""
        since = point_text(crept.since, crept.since_time, 8)
        creeping = f"{share}over {c.kinds()} since {code(since)}"
    return [
        code(s.test),
        code(s.fingerprint),
        text(s.metric or "?"),
        name,
        Markdown("; ".join(said) or "none"),
        Markdown(creeping or "no"),
    ]


def _chart(s: HistorySeries, commits: dict[str, Commits]) -> list[str]:
    peak, growth = commits["peak"], commits["growth"]
    most = peak if len(peak.names) >= len(growth.names) else growth
    shown = list(range(len(most.names)))[-CHART_COMMITS:]
    lines = [heading(3, f"{s.test} on {s.fingerprint} ({s.metric or '?'})"), ""]
    if not shown:
        return [*lines, "No value recorded.", ""]
    keys = [_key(most, i) for i in shown]
    values = {n: _aligned(commits[n], keys) for n in VALUES}
    known = [v for vs in values.values() for v in vs if not math.isnan(v)]
    top = max([_MIB, *known])
    labels = ", ".join(chr(34) + mermaid(_short(most, i)) + chr(34) for i in shown)
    lines += [
        f"{most.kinds()}; the last {len(shown)} shown: the first line peak, the second growth "
        "(MiB, the median of each commit's runs).",
        "",
        "```mermaid",
        "xychart-beta",
        f'    title "{mermaid(s.test)}"',
        f"    x-axis [{labels}]",
        f'    y-axis "MiB" {min([0.0, *known]) / _MIB:.1f} --> {top / _MIB * 1.05:.1f}',
        *(f"    line [{', '.join(_mib(v) for v in vs)}]" for vs in values.values()),
        "```",
        "",
    ]
    return lines


def _key(c: Commits, at: int) -> tuple[str | None, int | None]:
    """A point's key, the same for a value's points and another's: its commit, or for a run
    without one, its time."""
    name = c.names[at]
    return (name, None) if name is not None else (None, c.times[at] if c.times else at)


def _aligned(c: Commits, keys: list[tuple[str | None, int | None]]) -> list[float]:
    at = {_key(c, i): v for i, v in enumerate(c.values.tolist())}
    return [at.get(k, math.nan) for k in keys]


def _mib(value: float) -> str:
    return "0" if math.isnan(value) else f"{value / _MIB:.2f}"


def _short(c: Commits, at: int) -> str:
    """A point as a chart's axis and a step name it: a commit's first 8 characters, or the
    day and time of a run without one."""
    time = c.times[at] if c.times else None
    if c.names[at] is not None or time is None:
        return point_text(c.names[at], None, 8)
    return f"{datetime.datetime.fromtimestamp(time / 1e6, datetime.UTC):%m-%d %H:%M}"


def write_page(page: str, output: str | os.PathLike[str] | None) -> None:
    """The page to ``output`` (atomically, or a stream), or to stdout. ``BadInput`` for an
    output inside a local history (over its marker or a run, or beside them, where every
    parquet engine reading the folder would meet it)."""
    if output is None or os.fspath(output) == "-":
        print(page, end="")
        return
    around = history_around(Path(os.path.abspath(output)).parent)
    if around is not None:
        said = f"is inside the history {around}: write the page elsewhere"
        raise BadInput(said, path=os.fspath(output), field="-o")
    write_output(output, page)

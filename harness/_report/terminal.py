"""Short text for a terminal: why a test failed its memory rules, and one line per verdict."""

from __future__ import annotations

from collections.abc import Sequence

from harness._core.units import format_mib
from harness._core.wording import plural
from harness._measure.sample import Sample
from harness._verdict.model import CONFIGURATION, Verdict

MAX_ROWS = 24
CHILDREN = ("children_heap", "children_anon")
"""The children column's metric: their judged memory, else (older timelines) their anon."""


def worst_growth(verdict: Verdict) -> float | None:
    """The largest growth of any judged phase, in bytes (``None`` when nothing was judged)."""
    growths = [p.growth for p in verdict.phases if p.growth is not None]
    return max(growths, default=None)


def failure_message(
    verdict: Verdict, samples: Sequence[Sample], metric: str, held: Sequence[str] = ()
) -> str:
    """Findings, then who holds the memory (``held``: lines, as
    :meth:`harness._results.finish.Finished.holder_lines` gives them), then the checkpoint table:
    label, phase, MiB, delta against the phase start."""
    lines = [f"leakgate: memory verdict {verdict.status}"]
    lines += [f"  [{f.severity} {f.kind}] {f.message}" for f in verdict.findings]
    lines += held
    if verdict.error:
        kind = "configuration error" if verdict.error_kind == CONFIGURATION else "error"
        lines.append(f"  {kind}: {verdict.error}")
    lines += ["", *checkpoint_table(samples, metric)]
    return "\n".join(lines)


def checkpoint_table(samples: Sequence[Sample], metric: str) -> list[str]:
    """Named checkpoints in full; each run of per-batch samples as its first and last rows.
    When child processes lived, a column gives the memory they are judged on together
    (``children_heap``: each one's live heap, or its anon)."""
    children = next((m for m in CHILDREN if any(s.get(m) for s in samples)), None)
    rows: list[list[str]] = []
    starts: dict[tuple[str | None, int | None], int] = {}
    shown = _rows_to_show(samples, metric)
    gap = ["...", "", "", "", ""] if children else ["...", "", "", ""]
    for i, s in enumerate(samples):
        value = _reading(s, metric)
        key = (s.phase, s.epoch)
        if value is not None:
            starts.setdefault(key, value)
        if i not in shown:
            if shown.get(i - 1) is not None:
                rows.append(gap)
            continue
        label = s.label if s.batch is None else f"{s.label} #{s.batch}"
        if s.epoch is not None:
            label = f"epoch {s.epoch} {label}"
        delta = format_mib(value - starts[key], signed=True) if value is not None else "n/a"
        rows.append([label, s.phase or "", format_mib(value), delta])
        if children:
            rows[-1].append(format_mib(s.get(children)))
    if len(rows) > MAX_ROWS:
        half = MAX_ROWS // 2
        skipped = [f"... {plural(len(rows) - MAX_ROWS, 'row')} ...", *gap[1:]]
        rows = [*rows[:half], skipped, *rows[-half:]]
    header = ["checkpoint", "phase", metric, "delta", *([children] if children else [])]
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]
    return [
        "  "
        + "  ".join(
            cell.ljust(width) if c < 2 else cell.rjust(width)
            for c, (cell, width) in enumerate(zip(row, widths, strict=True))
        )
        for row in [header, *rows]
    ]


def _reading(sample: Sample, metric: str) -> int | None:
    """``sample``'s ``metric``, else its ``rss`` (a probe that reads no heap)."""
    value = sample.get(metric)
    return sample.get("rss") if value is None else value


def _rows_to_show(samples: Sequence[Sample], metric: str) -> dict[int, bool]:
    """Indices of samples worth a row: every named one, the first of a batch run and its last
    with a reading (a batch between two of the probe's stride readings has none), or its last
    where none has one."""
    shown: dict[int, bool] = {}
    read = None  # the current run's last sample with a reading
    for i, s in enumerate(samples):
        if s.batch is None:
            shown[i] = True
            continue
        prev = samples[i - 1] if i else None
        nxt = samples[i + 1] if i + 1 < len(samples) else None
        if prev is None or prev.label != s.label:
            shown[i], read = True, None
        if _reading(s, metric) is not None:
            read = i
        if nxt is None or nxt.label != s.label:
            shown[i if read is None else read] = True
    return shown

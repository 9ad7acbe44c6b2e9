"""Two gloo ranks judged like single runs, many times over: the false-alarm rate of the clean
shapes and the detection rate of the leaking one (``tests/test_ranks_shape.py``, each run through
``run_ranks`` as its tests run it, the shapes alternating). Each run's verdict is kept with each
rank's growth and resident high-water mark, and with what the cross-rank rule said before it
judged the rules' metric and budgets (a rank whose high-water mark rose 1 MiB more than the
others', ``max_peak`` or not, was a peak finding).

    python benchmarks/bench_ranks.py [--reps N] [--write]
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from common import section_arguments, show_section

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from test_ranks_shape import KEEPS, judged  # noqa: E402

HEADING = "## Distributed ranks: false alarms and detection"
OLD_GAP = 2**20
"""The cross-rank rule's gap for a peak before, ``max_peak`` or not: 1 MiB."""


def stood_out_before(peaks: list[float]) -> bool:
    """Whether a rank's peak rise stood out as the cross-rank rule judged it before."""
    for rank, value in enumerate(peaks):
        median = max(0.0, statistics.median(p for r, p in enumerate(peaks) if r != rank))
        if value - median > OLD_GAP and value > 2 * median:
            return True
    return False


@dataclass(frozen=True)
class Run:
    """One run of a shape: its status, whether a line names rank 1's holder, each rank's growth
    and peak rise (bytes), and its seconds."""

    status: str
    held: bool
    growth: tuple[float, ...]
    peak: tuple[float, ...]
    seconds: float


def one(keep: str) -> Run:
    """One run of the shape whose logging rank keeps ``keep``."""
    started = time.perf_counter()
    finished = judged(keep)
    phases = [p.verdict.phases[0] for p in finished.run.ranks]
    return Run(
        str(finished.verdict.status),
        any("rank 1: held by" in line for line in finished.lines()),
        tuple(s.growth or 0.0 for s in phases),
        tuple(float(s.peak_rise or 0) for s in phases),
        time.perf_counter() - started,
    )


def kib(values: list[float]) -> str:
    """The median and range of ``values`` in KiB."""
    low, high = min(values) / 2**10, max(values) / 2**10
    return f"{statistics.median(values) / 2**10:+.0f} ({low:+.0f} to {high:+.0f})"


def section(reps: int) -> str:
    load = os.getloadavg()[0]
    runs: dict[str, list[Run]] = {keep: [] for keep in KEEPS}
    for rep in range(reps):
        for keep in KEEPS if rep % 2 == 0 else KEEPS[::-1]:
            runs[keep].append(one(keep))
    rows = [
        "| logging rank keeps | runs | PASS | FAIL | ERROR | holder named | FAIL before | "
        "rank 0 growth KiB | rank 1 growth KiB | rank 1 peak rise MiB | s a run |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|---|---:|",
    ]
    for keep, found in runs.items():
        counts = Counter(r.status for r in found)
        named = sum(r.held for r in found)
        before = sum(r.status == "FAIL" or stood_out_before(list(r.peak)) for r in found)
        peaks = [r.peak[1] / 2**20 for r in found]
        rows.append(
            f"| {keep} | {len(found)} | {counts['PASS']} | {counts['FAIL']} | {counts['ERROR']} "
            f"| {named} | {before} | {kib([r.growth[0] for r in found])} "
            f"| {kib([r.growth[1] for r in found])} "
            f"| {statistics.median(peaks):.1f} ({min(peaks):.1f} to {max(peaks):.1f}) "
            f"| {statistics.median(r.seconds for r in found):.1f} |"
        )
    clean = [r for keep in KEEPS[:2] for r in runs[keep]]
    leaking = runs[KEEPS[2]]
    return "\n\n".join(
        [
            HEADING,
            f"Measured by `python benchmarks/bench_ranks.py --reps {reps} --write` (load average "
            f"{load:.2f} at the start; the three shapes alternating, {reps} runs each).",
            "Two gloo ranks, each validating a small model for 176 batches with one `all_gather` "
            "a batch after 8 warm-up batches, judged by phase validation, max_growth 4MB, "
            "warmup 5 (max_peak off); the logging rank (rank 1) keeps nothing, a 0-element "
            "clone of what it gathered, or 123 of its 128 rows (8.0 MiB over the loop after "
            "warm-up). Growth is the rules' metric (the live heap) after warm-up; the peak rise "
            "is the resident high-water mark, evidence only. *FAIL before*: the runs the "
            "cross-rank rule failed as it judged before (a rank's high-water mark 1 MiB above "
            "the others', `max_peak` or not), besides those that failed anyway.",
            "\n".join(rows),
            f"False alarms: {sum(r.status != 'PASS' for r in clean)} of {len(clean)} clean runs. "
            f"Leaks caught: {sum(r.status == 'FAIL' for r in leaking)} of {len(leaking)}, the "
            f"holder named from rank 1 in {sum(r.held for r in leaking)}.",
        ]
    )


def main() -> None:
    parser = section_arguments(__doc__.splitlines()[0])
    parser.set_defaults(reps=20)
    args = parser.parse_args()
    show_section(HEADING, section(args.reps), args.write)


if __name__ == "__main__":
    main()

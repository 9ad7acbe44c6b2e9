"""What the benchmarks share: repetitions, the incident's workload and process memory readings.

Memory is read from ``/proc`` directly rather than through the harness, so that the harness is
not the judge of its own comparisons.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from harness import Recorder, Rules, judge
from tft.data import Split, default_parquet, load
from tft.model import TFTConfig

REPS = int(os.environ.get("LEAKGATE_BENCH_REPS", "3"))
"""Repetitions of each interleaved A/B comparison (``benchmarks/run.py --reps``)."""

ROOT = Path(__file__).resolve().parent.parent
PAGE = os.sysconf("SC_PAGE_SIZE")

EPOCH_RULES = Rules(phase=("training", "validation"), max_growth="256KB", warmup=5, max_peak="16MB")
"""What a recorded TFT epoch is judged by (``bench_overhead.py``, ``bench_lightning.py``)."""


T = TypeVar("T")


def incident_split() -> Split:
    """The incident's data: 704 training and 176 validation windows (encoder 60, decoder 10)."""
    return load(default_parquet())


def incident_config(split: Split) -> TFTConfig:
    """The TFT ``python -m tft.train`` builds for ``split``: hidden size 32, 4 heads."""
    return TFTConfig(
        static_cardinalities=split.train.static_cardinalities,
        n_observed=split.train.n_observed,
        n_known=split.train.n_known,
        encoder_length=split.train.spec.encoder_length,
        decoder_length=split.train.spec.decoder_length,
    )


def rss() -> int:
    """Resident bytes of this process."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * PAGE


def reset_peak_rss() -> None:
    """Restart the kernel's high-water mark of resident memory (``VmHWM``) from now."""
    with open("/proc/self/clear_refs", "wb") as clear_refs:
        clear_refs.write(b"5")


def peak_rss() -> int:
    """The highest resident bytes since the last :func:`reset_peak_rss` (``VmHWM``)."""
    with open("/proc/self/status", "rb") as status:
        for line in status:
            if line.startswith(b"VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def section_arguments(description: str) -> argparse.ArgumentParser:
    """The options of a benchmark that writes a section of ``reports/bench.md`` of its own:
    ``--reps`` and ``--write``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="update reports/bench.md")
    return parser


def show_section(heading: str, text: str, write: bool) -> None:
    """Print a benchmark's section; with ``write``, put it in place of the section under
    ``heading`` in ``reports/bench.md`` (up to the next second-level heading, or after the last
    one), written whole, then renamed."""
    print(text)
    if not write:
        return
    bench = ROOT / "reports" / "bench.md"
    old = bench.read_text()
    start = old.find(heading)
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    else:
        end = old.find("\n## ", start + len(heading))
        new = old[:start] + text + "\n" + (old[end:] if end >= 0 else "")
    temporary = bench.with_name(f".{bench.name}.tmp")
    temporary.write_text(new)
    os.replace(temporary, bench)


def alternating(variants: Sequence[str], reps: int = REPS) -> list[tuple[int, str]]:
    """``(rep, variant)`` in run order: the variants alternate, and every other repetition runs
    them in reverse, so that none always goes first."""
    return [(r, v) for r in range(reps) for v in (variants if r % 2 == 0 else variants[::-1])]


def timed(callback: Callable[..., T], seconds: list[float]) -> Callable[..., T]:
    """``callback``, appending the seconds each call takes to ``seconds``."""

    def call(*args: object, **kwargs: object) -> T:
        started = time.perf_counter()
        result = callback(*args, **kwargs)
        seconds.append(time.perf_counter() - started)
        return result

    return call


def time_epoch(
    benchmark: Any,
    setup: Callable[[], tuple[tuple[Callable[[], object]], dict]],
    batches: int,
    recorders: Sequence[Recorder],
    checkpoints: Sequence[float],
) -> None:
    """Time one epoch with ``benchmark`` (one round): ``setup`` builds the run untimed and
    returns it as ``((run,), {})``; the epoch's CPU time is kept beside its wall time. Then
    each recorder ``setup`` made is judged by :data:`EPOCH_RULES` (timed apart) and closed,
    with the checkpoints' own times (``checkpoints``, filled by :func:`timed`) summarised."""

    def fit(run: Callable[[], object]) -> None:
        started = time.process_time()
        run()
        benchmark.extra_info["cpu_s"] = time.process_time() - started

    benchmark.pedantic(fit, setup=setup, rounds=1)
    benchmark.extra_info["batches"] = batches
    for recorder in recorders:
        started = time.perf_counter()
        verdict = judge(recorder.samples, EPOCH_RULES)
        benchmark.extra_info.update(
            judge_s=time.perf_counter() - started,
            verdict=verdict.status,
            checkpoints=len(checkpoints),
            checkpoint_median_s=statistics.median(checkpoints),
            checkpoints_s=sum(checkpoints),
        )
        recorder.close()

"""What the benchmarks share: repetitions, the incident's workload and process memory readings.

Memory is read from ``/proc`` directly rather than through the harness, so that the harness is
not the judge of its own comparisons.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from tft.data import Split, default_parquet, load
from tft.model import TFTConfig

REPS = int(os.environ.get("LEAKGATE_BENCH_REPS", "3"))
"""Repetitions of each interleaved A/B comparison (``benchmarks/run.py --reps``)."""

ROOT = Path(__file__).resolve().parent.parent
PAGE = os.sysconf("SC_PAGE_SIZE")


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


def alternating(variants: Sequence[str], reps: int = REPS) -> list[tuple[int, str]]:
    """``(rep, variant)`` in run order: the variants alternate, and every other repetition runs
    them in reverse, so that none always goes first."""
    return [(r, v) for r in range(reps) for v in (variants if r % 2 == 0 else variants[::-1])]

"""Smallest per-batch leak the CPU path detects over 176 validation batches, and the verdicts
on the shapes growth takes (a leak starting late, a cache that fills, a bounded window).

Each run is a real TFT inference loop (default model, batch 1) with a checkpoint per batch,
judged with ``max_growth`` (default 64KiB). A leak of N bytes per batch keeps one uint8 tensor
of N bytes per batch. Clean runs must never fail; a leak size counts as detected when every run
of it fails with a ``leak`` finding. The shapes are judged with ``max_growth`` 4MB, each run
with its own seed for the inputs.

    python benchmarks/sensitivity.py [--runs 50] [--max-growth 64KiB] [--shapes]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from report import sensitivity_table, shapes_table

from harness import Recorder, judge
from harness._verdict.options import Rules
from tft.model import TemporalFusionTransformer, TFTConfig

BATCHES = 176
SIZES = (0, 128, 256, 384, 512, 768, 1024)


def one_run(model: TemporalFusionTransformer, batch: dict, leak: int, rules: Rules) -> tuple:
    kept = []
    with Recorder("cpu") as rec, torch.inference_mode():
        with rec.phase("validation", epoch=0):
            for i in range(BATCHES):
                model(batch)
                if leak:
                    kept.append(torch.empty(leak, dtype=torch.uint8))
                rec.checkpoint("VALIDATION_BATCH", batch=i)
        verdict = judge(rec.samples, rules)
    stats = next(p for p in verdict.phases if p.phase == "validation")
    return bool(verdict.of_kind("leak")), stats.slope or 0.0, stats.growth or 0.0


def sensitivity(
    runs: int = 50, max_growth: str = "64KiB", sizes: Sequence[int] = SIZES
) -> list[dict[str, float]]:
    """One row per leak size: runs flagged, median slope (B/batch), largest growth (bytes) and
    seconds per run."""
    torch.manual_seed(0)
    config = TFTConfig()
    model = TemporalFusionTransformer(config).eval()
    batch = inputs(config)
    rules = Rules(phase="validation", max_growth=max_growth, warmup=5)
    rows = []
    for size in sizes:
        started = time.perf_counter()
        results = [one_run(model, batch, size, rules) for _ in range(runs)]
        rows.append(
            {
                "leak": size,
                "flagged": sum(r[0] for r in results),
                "runs": runs,
                "median_slope": statistics.median(r[1] for r in results),
                "max_growth": max(r[2] for r in results),
                "seconds_per_run": (time.perf_counter() - started) / runs,
            }
        )
    return rows


SHAPE_BUDGET = 4_000_000
"""The shapes' ``max_growth`` (4MB), in bytes."""


@dataclass(frozen=True)
class Shape:
    """A loop of ``batches`` whose ``keep(i)`` returns what batch ``i`` keeps (bytes, or 0), kept
    in a deque of ``window`` items (all of them when None); ``truth`` is what it keeps after the
    warm-up by the loop's end, in bytes."""

    name: str
    batches: int
    keep: Callable[[int], int]
    window: int | None = None

    @property
    def truth(self) -> int:
        kept = [self.keep(i) for i in range(self.batches)]
        last = kept[-self.window :] if self.window else kept
        first = kept[: WARMUP + 1][-self.window :] if self.window else kept[: WARMUP + 1]
        return sum(last) - sum(first)


WARMUP = 5


def leak_from(fraction: float, *, batches: int = 704, times: float = 1.25) -> Shape:
    """A leak from ``fraction`` of the loop on, ``times`` the budget by its end."""
    onset = round(fraction * batches)
    each = round(times * SHAPE_BUDGET / (batches - max(onset, WARMUP + 1)))
    name = f"leak from batch {onset} of {batches}, {times:g}x the budget"
    return Shape(name, batches, lambda i: each if i >= onset else 0)


SHAPES = (
    leak_from(0.0),
    leak_from(0.5),
    leak_from(0.8),
    Shape(
        "cache filled in batches 0-31 of 176, 2x the budget",
        176,
        lambda i: round(2 * SHAPE_BUDGET / 26) if i < 32 else 0,
    ),
    Shape(
        "window of the last 16 batches of 176 (a deque), 2x the budget",
        176,
        lambda i: round(2 * SHAPE_BUDGET / 10),
        window=16,
    ),
)


def shape_run(
    model: TemporalFusionTransformer, config: TFTConfig, shape: Shape, seed: int
) -> tuple:
    """One run of ``shape``: (failed for a leak, growth, onset)."""
    torch.manual_seed(seed)
    kept: collections.deque = collections.deque(maxlen=shape.window)
    rules = Rules(phase="validation", max_growth=SHAPE_BUDGET, warmup=WARMUP)
    with Recorder("cpu") as rec, torch.inference_mode():
        with rec.phase("validation", epoch=0):
            for i in range(shape.batches):
                model(inputs(config))
                if size := shape.keep(i):
                    kept.append(torch.empty(size, dtype=torch.uint8))
                rec.checkpoint("VALIDATION_BATCH", batch=i)
        verdict = judge(rec.samples, rules)
    stats = next(p for p in verdict.phases if p.phase == "validation")
    return bool(verdict.of_kind("leak")), stats.growth or 0.0, stats.onset


def shape_sensitivity(runs: int = 20) -> list[dict[str, object]]:
    """One row per shape: runs failed for a leak, the median growth against the true one, the
    median onset named (where one was) and seconds per run."""
    config = TFTConfig()
    torch.manual_seed(0)
    model = TemporalFusionTransformer(config).eval()
    rows: list[dict[str, object]] = []
    for shape in SHAPES:
        started = time.perf_counter()
        results = [shape_run(model, config, shape, seed) for seed in range(runs)]
        onsets = [r[2] for r in results if r[2] is not None]
        rows.append(
            {
                "shape": shape.name,
                "failed": sum(r[0] for r in results),
                "runs": runs,
                "growth": statistics.median(r[1] for r in results) / shape.truth,
                "onset": statistics.median(onsets) if onsets else None,
                "seconds_per_run": (time.perf_counter() - started) / runs,
            }
        )
    return rows


def inputs(config: TFTConfig) -> dict[str, torch.Tensor]:
    """A random batch of one window."""
    return {
        "static": torch.zeros(1, 1, dtype=torch.long),
        "observed": torch.randn(1, config.encoder_length, config.n_observed),
        "known": torch.randn(1, config.encoder_length + config.decoder_length, config.n_known),
        "target": torch.randn(1, config.decoder_length),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--max-growth", default="64KiB")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--shapes", action="store_true", help="the shapes' table instead")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"{args.runs} runs x {BATCHES} batches per size, max_growth {args.max_growth}, torch "
        f"{torch.__version__}"
    )
    if args.shapes:
        print(shapes_table(shape_sensitivity(args.runs)))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    print(sensitivity_table(sensitivity(args.runs, args.max_growth, sizes)))


if __name__ == "__main__":
    main()

"""Smallest per-batch leak the CPU path detects over 176 validation batches.

Each run is a real TFT inference loop (default model, batch 1) with a checkpoint per batch,
judged with ``max_growth`` (default 64KiB). A leak of N bytes per batch keeps one uint8 tensor
of N bytes per batch. Clean runs must never fail; a leak size counts as detected when every run
of it fails with a ``leak`` finding.

    python benchmarks/sensitivity.py [--runs 50] [--max-growth 64KiB]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

import torch
from report import sensitivity_table

from harness import Recorder, judge
from harness.rules import Rules
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
    batch = {
        "static": torch.zeros(1, 1, dtype=torch.long),
        "observed": torch.randn(1, config.encoder_length, config.n_observed),
        "known": torch.randn(1, config.encoder_length + config.decoder_length, config.n_known),
        "target": torch.randn(1, config.decoder_length),
    }
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--max-growth", default="64KiB")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"{args.runs} runs x {BATCHES} batches per size, max_growth {args.max_growth}, torch "
        f"{torch.__version__}"
    )
    sizes = [int(s) for s in args.sizes.split(",")]
    print(sensitivity_table(sensitivity(args.runs, args.max_growth, sizes)))


if __name__ == "__main__":
    main()

"""What leakgate keeps for itself never reads as the run's growth, in the total judged or in a
part shown: the snapshot a phase takes when its warm-up ends holds a table of every live tensor
(tens of KiB for a few hundred tensors, as a DDP rank holds), and a recorder takes all of it out
of its readings, its small objects out of Python's part and its tables out of ``malloc``'s."""

from __future__ import annotations

import pytest
import torch

from harness import judge
from harness._recorder import Recorder
from harness._verdict.options import Rules

LIVE = 5000
"""Tensors alive through the loop, made once the recorder runs (as a rank makes its model): the
snapshot's tables of them weigh hundreds of KiB."""
BATCHES = 40
RULES = Rules(phase="validation", max_growth="16KiB", warmup=5)


def loop(kept_per_batch: int) -> tuple[object, dict[str, float]]:
    """A validation loop over :data:`LIVE` live tensors that keeps ``kept_per_batch`` bytes a
    batch; its verdict and each part's growth over the judged batches."""
    kept = []
    with Recorder("cpu", rules=RULES, attribute=True) as rec:
        live = [torch.zeros(1) for _ in range(LIVE)]  # made after its freeze: in the snapshot
        with rec.phase("validation", epoch=0):
            for batch in range(BATCHES):
                if kept_per_batch:
                    kept.append(torch.ones(kept_per_batch // 4))
                rec.checkpoint("VALIDATION_BATCH", batch=batch)
        verdict = judge(rec.samples, RULES)
    batches = [s for s in rec.samples if s.label == "VALIDATION_BATCH" and s.get("python")]
    first, last = batches[RULES.warmup], batches[-1]
    grown = {m: last.get(m) - first.get(m) for m in ("allocated", "malloc", "python")}
    del live, kept
    return verdict, grown


def test_the_snapshot_of_many_live_tensors_is_no_growth_of_the_loop_in_total_or_in_a_part():
    verdict, grown = loop(0)
    assert verdict.status == "PASS", grown
    assert all(abs(v) < 16 << 10 for v in grown.values()), grown


@pytest.mark.parametrize("kept", [1 << 10, 256])
def test_the_same_loop_keeping_a_little_each_batch_fails(kept):
    verdict, grown = loop(kept)
    assert verdict.status == "FAIL", grown
    assert grown["allocated"] >= (BATCHES - RULES.warmup - 1) * kept

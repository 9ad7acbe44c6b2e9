"""Cost of one checkpoint, per probe, with and without collection, with and without a timeline.

    pytest benchmarks/bench_checkpoint.py

Run as a script, it prints the CPU noise floor instead: the spread of ``rss`` and
``allocated`` over 176 checkpoints after a warm-up, plain and collected, idle and with a small
training step between them.

    python benchmarks/bench_checkpoint.py
"""

from __future__ import annotations

import itertools
import statistics

import pytest
import torch

from harness import Recorder

PROBES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
        ],
    ),
]


@pytest.fixture(params=PROBES)
def probe(request) -> str:
    return request.param


@pytest.mark.parametrize("timeline", [False, True], ids=["memory", "timeline"])
def test_checkpoint(benchmark, probe, timeline, tmp_path):
    with Recorder(probe, timeline=tmp_path / "t.jsonl" if timeline else None) as rec:
        benchmark.pedantic(rec.checkpoint, ("TRAIN_BATCH",), setup=rec.samples.clear, rounds=20_000)


def test_checkpoint_collect(benchmark, probe, tmp_path):
    """A full ``gc.collect()`` plus the probe's release; torch's objects are frozen by then."""
    with Recorder(probe, timeline=tmp_path / "t.jsonl") as rec:
        benchmark.pedantic(
            rec.checkpoint,
            ("EPOCH_END",),
            {"collect": True},
            setup=rec.samples.clear,
            rounds=500,
            warmup_rounds=5,
        )


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    loss = model(torch.randn(32, 256)).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def noise_floor(checkpoints: int = 176, warmup: int = 20) -> list[dict[str, object]]:
    """The spread of the CPU metrics over checkpoints after a warm-up: idle, and with a small
    training step (a 256x256 linear layer, Adam) between checkpoints; one row per case and
    metric, in bytes."""
    model = torch.nn.Linear(256, 256)
    optimizer = torch.optim.Adam(model.parameters())
    rows = []
    for work in (False, True):
        for collect in (False, True):
            with Recorder("cpu") as rec:
                for batch in range(warmup + checkpoints):
                    if work:
                        train_step(model, optimizer)
                    rec.checkpoint("batch", batch=batch, collect=collect)
                samples = rec.samples[warmup:]
            for metric in ("rss", "allocated"):
                values = [s.get(metric) for s in samples]
                steps = [b - a for a, b in itertools.pairwise(values)]
                rows.append(
                    {
                        "between": "train step" if work else "idle",
                        "collect": collect,
                        "metric": metric,
                        "range": max(values) - min(values),
                        "end_minus_start": values[-1] - values[0],
                        "step_stdev": statistics.pstdev(steps),
                    }
                )
    return rows


if __name__ == "__main__":
    from report import noise_table

    torch.set_num_threads(1)
    print(noise_table(noise_floor()))

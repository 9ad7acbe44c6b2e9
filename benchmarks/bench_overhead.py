"""Harness overhead on real work: one TFT epoch at the incident's size, recorded or not.

One epoch is 704 training and 176 validation windows at batch 1 on the CPU, through
``tft.Trainer``. ``recorded`` attaches a ``Recorder("cpu")`` writing a JSONL timeline as the
trainer's callback, so it samples at every named checkpoint (889 per epoch); ``plain`` has no
callback. Repetitions alternate the two (``common.alternating``), and each builds the same
model from the same seed, so both variants do the same arithmetic. The recorder's calls are also
timed one by one (a checkpoint inside real work), the epoch's CPU time is kept beside its wall
time (less disturbed by other processes), and judging the timeline is timed apart.

Each pair runs without DataLoader workers (the incident's set-up) and with 2 (``num_workers=2``,
forked, started anew each phase), where the recorder reads the workers' memory too: the goal is
an overhead with workers within 1.5x of the one without.

    pytest benchmarks/bench_overhead.py
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from common import alternating, incident_config, incident_split, time_epoch, timed
from torch.utils.data import Subset

from harness import Recorder
from tft.data import Split
from tft.model import TemporalFusionTransformer
from tft.trainer import TrainConfig, Trainer

CONFIG = TrainConfig(epochs=1, batch_size=1, device="cpu")
WORKERS = (0, 2)
"""DataLoader workers of the epochs compared (``TrainConfig.num_workers``)."""
EPOCHS = sorted(
    (
        (rep, variant, workers)
        for workers in WORKERS
        for rep, variant in alternating(("plain", "recorded"))
    ),
    key=lambda run: run[0],
)
"""``(rep, variant, workers)`` in run order: each repetition runs one alternating pair per
number of workers."""


@pytest.fixture(scope="module")
def split() -> Split:
    """The incident's windows, after an untimed short epoch has warmed torch's kernels."""
    split = incident_split()
    warm = Trainer(TemporalFusionTransformer(incident_config(split)), CONFIG)
    warm.fit(Subset(split.train, range(32)), Subset(split.val, range(8)))
    return split


@pytest.mark.parametrize(("rep", "variant", "workers"), EPOCHS)
def test_epoch(benchmark, split, variant, rep, workers, tmp_path):
    recorders: list[Recorder] = []
    checkpoints: list[float] = []

    def setup() -> tuple[tuple[Callable[[], object]], dict]:
        """The run to time, built untimed: the model, and the trainer with its callback."""
        torch.manual_seed(0)
        callbacks = []
        if variant == "recorded":
            recorders.append(Recorder("cpu", timeline=tmp_path / "epoch.jsonl"))
            callbacks.append(timed(recorders[-1], checkpoints))
        trainer = Trainer(
            TemporalFusionTransformer(incident_config(split)),
            replace(CONFIG, num_workers=workers),
            callbacks=callbacks,
        )
        return (lambda: trainer.fit(split.train, split.val),), {}

    time_epoch(benchmark, setup, len(split.train) + len(split.val), recorders, checkpoints)
    if recorders:  # the checkpoints that kept a child's rollup (USS), read by it or by us
        benchmark.extra_info["rollups"] = sum(
            any(m.startswith("child_uss:") and v is not None for m, v in s.metrics.items())
            for s in recorders[-1].samples
        )


PARTS_WINDOWS = (256, 64)
"""Training and validation windows of the shorter epoch :func:`test_checkpoint_parts` runs."""


def test_checkpoint_parts(benchmark, split, tmp_path):
    """Where a checkpoint's time goes inside training: each of the probe's reads, the
    children's reading, the timeline line's building and its copy into the file, and the
    store's append timed at every call (the clock's own cost, about 0.1 µs a call, is in them),
    over a shorter epoch; what the checkpoint takes beyond them is the recorder's Python.
    Mean µs per checkpoint go to ``extra_info``."""
    torch.manual_seed(0)
    recorder = Recorder("cpu", timeline=tmp_path / "epoch.jsonl")
    probe, writer = recorder.probe, recorder._timeline
    assert writer is not None
    spent: dict[str, list[float]] = {}
    for owner, name, part in (
        (probe._host._python, "read", "Python's allocator (its walk, in the host's reads)"),
        (probe._host, "read", "host's reads (mallinfo2 x2, Python's allocator, pools, statm)"),
        (probe, "_peak", "peak (getrusage, VmHWM when above rss)"),
        (probe, "reset_peak", "peak reset (clear_refs)"),
        (recorder._children, "read", "children read (none alive)"),
        (writer._format, "recorded", "timeline line built"),
        (writer._file, "append", "timeline line put in the file"),
        (recorder.samples, "append", "store append"),
        (recorder.samples, "append_unread", "store append"),
    ):
        setattr(owner, name, timed(getattr(owner, name), spent.setdefault(part, [])))
    checkpoints: list[float] = []
    trainer = Trainer(
        TemporalFusionTransformer(incident_config(split)),
        CONFIG,
        callbacks=[timed(recorder, checkpoints)],
    )
    (n_train, n_val) = PARTS_WINDOWS
    train, val = Subset(split.train, range(n_train)), Subset(split.val, range(n_val))
    benchmark.pedantic(trainer.fit, (train, val), rounds=1)
    recorder.close()
    n = len(checkpoints)
    parts = {part: sum(seconds) / n for part, seconds in spent.items()}
    total = sum(checkpoints) / n
    benchmark.extra_info.update(
        checkpoints=n,
        windows=PARTS_WINDOWS,
        checkpoint_mean_s=total,
        parts_s={**parts, "the rest (Python)": total - sum(parts.values())},
    )

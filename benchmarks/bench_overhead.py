"""Harness overhead on real work: one TFT epoch at the incident's size, recorded or not.

One epoch is 704 training and 176 validation windows at batch 1 on the CPU, through
``tft.Trainer``. ``recorded`` attaches a ``Recorder("cpu")`` writing a JSONL timeline as the
trainer's callback, so it samples at every named checkpoint (889 per epoch); ``plain`` has no
callback. Repetitions alternate the two (``common.alternating``), and each builds the same
model from the same seed, so both variants do the same arithmetic. The recorder's calls are also
timed one by one (a checkpoint inside real work), the epoch's CPU time is kept beside its wall
time (less disturbed by other processes), and judging the timeline is timed apart.

    pytest benchmarks/bench_overhead.py
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from common import alternating, incident_config, incident_split, time_epoch, timed
from torch.utils.data import Subset

from harness import Recorder
from tft.data import Split
from tft.model import TemporalFusionTransformer
from tft.trainer import TrainConfig, Trainer

CONFIG = TrainConfig(epochs=1, batch_size=1, device="cpu")


@pytest.fixture(scope="module")
def split() -> Split:
    """The incident's windows, after an untimed short epoch has warmed torch's kernels."""
    split = incident_split()
    warm = Trainer(TemporalFusionTransformer(incident_config(split)), CONFIG)
    warm.fit(Subset(split.train, range(32)), Subset(split.val, range(8)))
    return split


@pytest.mark.parametrize(("rep", "variant"), alternating(("plain", "recorded")))
def test_epoch(benchmark, split, variant, rep, tmp_path):
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
            TemporalFusionTransformer(incident_config(split)), CONFIG, callbacks=callbacks
        )
        return (lambda: trainer.fit(split.train, split.val),), {}

    time_epoch(benchmark, setup, len(split.train) + len(split.val), recorders, checkpoints)

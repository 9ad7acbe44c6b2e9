"""The Lightning callback's overhead on one TFT epoch, beside the plain loop's.

One epoch is 704 training and 176 validation windows at batch 1 on the CPU, the TFT at the
incident's size, three ways: ``loop`` is ``tft.Trainer`` without callbacks (the plain figure of
``bench_overhead.py``); ``lightning`` is a ``lightning.Trainer`` fitting the same model, the
same loss and a fused Adam with gradients clipped at 1.0, without a callback; ``recorded`` is
that trainer with a ``LeakGateCallback`` recording into a ``Recorder("cpu")`` that writes a
timeline. The callback's overhead is ``recorded / lightning``. The recorder's checkpoints are
also timed one by one, as in ``bench_overhead.py``: their sum is less disturbed by other
processes than an epoch's time. Subnormals are flushed in all three, as ``tft.Trainer`` does.
Repetitions alternate the variants (``common.alternating``); each builds the same model from
the same seed.

    pytest benchmarks/bench_lightning.py
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from common import alternating, incident_config, incident_split, time_epoch, timed
from torch.utils.data import DataLoader, Dataset, Subset

from harness import Recorder
from tft.data import Split
from tft.model import TemporalFusionTransformer, TFTConfig, quantile_loss
from tft.trainer import Batch, TrainConfig, Trainer

L = pytest.importorskip("lightning")

from harness.integrations.lightning import LeakGateCallback  # noqa: E402

VARIANTS = ("loop", "lightning", "recorded")


class Forecaster(L.LightningModule):
    """The TFT as a LightningModule: the loss and optimizer ``tft.Trainer`` uses."""

    def __init__(self, config: TFTConfig) -> None:
        super().__init__()
        self.model = TemporalFusionTransformer(config)
        self.quantiles = tuple(config.quantiles)

    def loss(self, batch: Batch) -> torch.Tensor:
        return quantile_loss(self.model(batch), batch["target"], self.quantiles)

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        return self.loss(batch)

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self.log("val_loss", self.loss(batch), batch_size=1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3, fused=True)


def lightning_trainer(callbacks: list[LeakGateCallback]) -> L.Trainer:
    return L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        callbacks=callbacks,
        gradient_clip_val=1.0,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
    )


def lightning_fit(trainer: L.Trainer, module: Forecaster, train: Dataset, val: Dataset) -> None:
    torch.set_flush_denormal(True)
    try:
        trainer.fit(module, DataLoader(train, batch_size=1), DataLoader(val, batch_size=1))
    finally:
        torch.set_flush_denormal(False)


@pytest.fixture(scope="module")
def split() -> Iterator[Split]:
    """The incident's windows, after untimed short epochs of both trainers."""
    split = incident_split()
    config = incident_config(split)
    train, val = Subset(split.train, range(32)), Subset(split.val, range(8))
    Trainer(TemporalFusionTransformer(config), TrainConfig(epochs=1, device="cpu")).fit(train, val)
    with Recorder("cpu") as recorder:
        trainer = lightning_trainer([LeakGateCallback(recorder)])
        lightning_fit(trainer, Forecaster(config), train, val)
    yield split


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(("rep", "variant"), alternating(VARIANTS))
def test_lightning_epoch(benchmark, split, variant, rep, tmp_path):
    config = incident_config(split)
    recorders: list[Recorder] = []
    checkpoints: list[float] = []

    def setup() -> tuple[tuple[Callable[[], object]], dict]:
        """The run to time, built untimed: the model, and the trainer with its callback."""
        torch.manual_seed(0)
        if variant == "loop":
            loop = Trainer(TemporalFusionTransformer(config), TrainConfig(epochs=1, device="cpu"))
            return (lambda: loop.fit(split.train, split.val),), {}
        callbacks = []
        if variant == "recorded":
            recorder = Recorder("cpu", timeline=tmp_path / "epoch.jsonl")
            recorder.checkpoint = timed(recorder.checkpoint, checkpoints)  # type: ignore[method-assign]
            recorders.append(recorder)
            callbacks.append(LeakGateCallback(recorder))
        trainer, module = lightning_trainer(callbacks), Forecaster(config)
        return (lambda: lightning_fit(trainer, module, split.train, split.val),), {}

    time_epoch(benchmark, setup, len(split.train) + len(split.val), recorders, checkpoints)

"""What the dearer search (``--memreport-explain``) costs on a Lightning fit of the catalogue's
size, against the same fit searched the default way.

The fit: the catalogue's model (64 -> 256 -> 64), 30 training and 30 validation batches of
64 rows, one epoch, on the CPU, with a validation step that keeps each loss with its graph (the
incident's pattern), so the run crosses its budget and is searched. ``plain`` records with a
``PhaseAttribution`` that names holders where the growth passes 1 MB and as it doubles;
``explain`` is the same with ``explain=True`` (every operator's storage noted with its line,
Python objects traced). Repetitions alternate the two; the ratio is per repetition, then the
median.

    python benchmarks/bench_explain.py
"""

from __future__ import annotations

import statistics
import time

import lightning as L
import torch
from torch import nn

from harness._attribution.phase import PhaseAttribution
from harness._recorder import Recorder
from harness._verdict.options import Rules
from harness.integrations.lightning import LeakGateCallback

BATCHES = 30
REPS = 5


class Kept(L.LightningModule):
    """The catalogue's model; its validation keeps every loss with its graph."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
        self.val_losses: list[torch.Tensor] = []

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.model(x), y)

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        with torch.enable_grad():
            self.val_losses.append(nn.functional.mse_loss(self.model(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def loader() -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(BATCHES * 64, 64, generator=generator), torch.randn(BATCHES * 64, 64)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64)


def fit(explain: bool) -> float:
    """Seconds for one fit recorded with the search chosen."""
    attribution = PhaseAttribution(growth="1MB", at_end=False, explain=explain, warmup=5)
    recorder = Recorder("cpu", attribute=attribution)
    rules = Rules(phase=("validation",), max_growth="1MB")
    callback = LeakGateCallback(recorder, rules=rules)
    trainer = L.Trainer(
        max_epochs=1,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        accelerator="cpu",
    )
    started = time.perf_counter()
    try:
        trainer.fit(Kept(), loader(), loader())
    finally:
        recorder.close()  # a recorder given to the callback stays open; its search with it
    return time.perf_counter() - started


def main() -> None:
    fit(False)  # imports and first-use costs out of the timings
    seconds: dict[bool, list[float]] = {False: [], True: []}
    for rep in range(REPS):
        for explain in (rep % 2 == 1, rep % 2 == 0):
            seconds[explain].append(fit(explain))
    ratios = [e / p for e, p in zip(seconds[True], seconds[False], strict=True)]
    for name, times in (("plain", seconds[False]), ("explain", seconds[True])):
        print(f"{name:<8} median {statistics.median(times):6.2f} s, best {min(times):6.2f} s")
    print(f"explain / plain: median {statistics.median(ratios):.2f}x over {REPS} repetitions")


if __name__ == "__main__":
    main()

"""Validation scores: the bounded running sums a validation loop adds each batch to (summed
across ranks under DDP), and the constant-quantile baseline a trained model must beat."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tft.loading import Windows
from tft.model import pinball


@dataclass
class Accumulator:
    """Running sums for validation: a few device scalars whatever the number of batches.

    ``padding`` is how many rows at the end of the next batch repeat windows another rank
    scores (a distributed shard's padding): the trainer's ``score`` leaves them out."""

    loss: torch.Tensor | None = None
    pinball: torch.Tensor | None = None
    scale: torch.Tensor | None = None
    count: int = 0
    padding: int = 0

    def add(self, loss: torch.Tensor, pinball: torch.Tensor, scale: torch.Tensor, n: int) -> None:
        def plus(total: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
            return x.detach() if total is None else total + x.detach()

        self.loss = plus(self.loss, loss * n)
        self.pinball = plus(self.pinball, pinball)
        self.scale = plus(self.scale, scale)
        self.count += n

    def result(self) -> tuple[float, list[float]]:
        """Mean loss per window and the normalised q-risk of each quantile."""
        if self.loss is None or self.pinball is None or self.scale is None:
            raise ValueError("no validation batch was scored")
        q_risk = 2 * self.pinball / self.scale.clamp_min(1e-12)
        return float(self.loss) / self.count, q_risk.tolist()

    def reduce(self, quantiles: int, device: torch.device) -> None:
        """Sum the sums of every rank into each rank's (a rank that scored nothing adds 0)."""
        zero = torch.zeros((), dtype=torch.float64, device=device)
        parts = [
            (self.loss if self.loss is not None else zero).double().reshape(1),
            (self.scale if self.scale is not None else zero).double().reshape(1),
            torch.tensor([float(self.count)], dtype=torch.float64, device=device),
            (
                self.pinball.double()
                if self.pinball is not None
                else torch.zeros(quantiles, dtype=torch.float64, device=device)
            ),
        ]
        total = torch.cat(parts)
        dist.all_reduce(total)
        self.loss, self.scale = total[0].float(), total[1].float()
        self.count = round(float(total[2]))
        self.pinball = total[3:].float()


def baseline_q_risk(train: Windows, val: Windows, quantiles: Sequence[float]) -> list[float]:
    """Normalised q-risk on ``val`` of constant quantiles fitted on the training targets."""
    fitted = torch.stack([train[i]["target"] for i in range(len(train))]).flatten()
    levels = torch.quantile(fitted, torch.tensor(quantiles, dtype=fitted.dtype))
    target = torch.stack([val[i]["target"] for i in range(len(val))])
    prediction = levels.expand(*target.shape, len(quantiles))
    return (
        2 * pinball(prediction, target, quantiles).flatten(0, -2).sum(0) / target.abs().sum()
    ).tolist()

"""A phase's batches for the trainer: its windows in the phase's order and batch size, collated
in the training process (``num_workers=0``, the incident's set-up) or by the worker processes of
a ``torch.utils.data.DataLoader``.

With workers, the DataLoader's batch sampler is the trainer's plan for the pass: the index lists
it computed (the epoch's shuffled order, the rank's ``DistributedSampler``-style share, the batch
size after any back-off), so both ways give the same batches. The DataLoader draws its workers'
seeds from a generator of its own, seeded for each pass (torch, ``random`` and numpy in a worker
are seeded from it and the worker's id), so it never draws from the global generator that
dropout in the training process reads: training with and without workers sees the same random
numbers. Persistent workers start once per :class:`Loader` and re-read the plan at each pass.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, cast

import torch
from torch.utils.data import DataLoader, Dataset, default_collate

__all__ = ["Batch", "Loader", "Plan", "Windows"]

Batch = dict[str, torch.Tensor]


class Windows(Protocol):
    """What the trainer reads windows from: a sized, indexable dataset of batch dicts."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Batch: ...


class Plan:
    """A DataLoader's batch sampler whose index lists are set before each pass."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class Loader:
    """The batches of one dataset on ``device``, made by ``workers`` processes (none: here)."""

    def __init__(
        self, data: Windows, device: torch.device, workers: int = 0, *, persistent: bool = False
    ) -> None:
        self.data, self.device = data, device
        self._plan = Plan()
        self._generator = torch.Generator()
        self._loader: DataLoader[Batch] | None = None
        if workers:
            self._loader = DataLoader(
                cast(Dataset[Batch], data),
                batch_sampler=self._plan,
                num_workers=workers,
                persistent_workers=persistent,
                generator=self._generator,
            )

    def batches(self, order: Sequence[int], size: int, seed: int = 0) -> Iterator[Batch]:
        """The windows of ``order`` in batches of ``size`` (the last one partial), collated and
        on the device; ``seed`` seeds the workers of this pass. No batch is held here once it
        was handed out."""
        starts = range(0, len(order), size)
        if self._loader is None:
            return (self._to_device(self._collate(order[s : s + size])) for s in starts)
        self._plan.batches = [list(order[s : s + size]) for s in starts]
        self._generator.manual_seed(seed)
        return map(self._to_device, self._loader)

    def _collate(self, indices: Sequence[int]) -> Batch:
        return default_collate([self.data[i] for i in indices])

    def _to_device(self, batch: Batch) -> Batch:
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

"""Known faults: trainer variants that each bring back one bug of the incident (or a classic).

Each fault is a :class:`Trainer` subclass overriding one hook, or a change to the
:class:`TrainConfig` (``val-batch-32``); several combine into one trainer class. They exist to
prove that leakgate catches them, and are selected by name::

    trainer = build_trainer(model, config, faults=["val-attention-cache", "val-batch-32"])

or ``python -m tft.train --inject-fault NAME``. The production code paths never refer to them.
``param-store-ref`` keeps parameters in a class-level store on purpose: :func:`reset` empties it.

:data:`FAULTS` are the one-process faults; :data:`DISTRIBUTED_FAULTS` leak under DDP (run them
with ``torchrun``: in one process they still leak, on the only rank there is);
:data:`WORKER_FAULTS` leak inside DataLoader workers and need ``num_workers >= 1``. Every
function here takes a name from any of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

from tft.model import Interpretation, TemporalFusionTransformer
from tft.trainer import Batch, Callback, TrainConfig, Trainer, Windows


class ValAttentionCache(Trainer):
    """Validation records a graph and keeps every batch's attention tensor (graph attached),
    clearing them only after the loop."""

    @contextmanager
    def validation_mode(self) -> Iterator[None]:
        cache: list[torch.Tensor] = []

        def keep(module: nn.Module, inputs: Any, output: tuple[torch.Tensor, ...]) -> None:
            cache.append(output[1])

        handle = self.model.attention.register_forward_hook(keep)
        try:
            with super().validation_mode(), torch.inference_mode(False), torch.enable_grad():
                yield
        finally:
            handle.remove()
            cache.clear()


class KeepOptimizer(Trainer):
    """The optimizer state stays where it is during validation."""

    def release_optimizer(self) -> None:
        pass

    def restore_optimizer(self) -> None:
        pass


class ParamStoreRef(Trainer):
    """Every trainer adds its parameters to a store shared by the class, so they outlive it."""

    store: ClassVar[list[list[nn.Parameter]]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.store.append(list(self.model.parameters()))


class QatLrStale(Trainer):
    """The QAT schedule's rate goes to the trainer's own ``lr`` field, never to the optimizer."""

    lr: float | None = None

    def step_schedule(self) -> None:
        if self.scheduler is not None:
            self.scheduler.last_epoch += 1
            step = self.scheduler.last_epoch
            self.lr = float(self.scheduler.base_lrs[0] * self.scheduler.lr_lambdas[0](step))


class LossAccumulate(Trainer):
    """A running training loss summed as a tensor, graph attached, for the whole session."""

    running_loss: torch.Tensor | None = None

    def training_loss(self, batch: Batch) -> torch.Tensor:
        loss = super().training_loss(batch)
        self.running_loss = loss if self.running_loss is None else self.running_loss + loss
        return loss


class HookPerEpoch(Trainer):
    """Each epoch adds a forward hook to the model that stores its outputs; none is removed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hooked_outputs: list[torch.Tensor] = []
        self.callbacks.insert(0, self._add_hook)

    def _add_hook(self, label: str, **_: Any) -> None:
        if label == "EPOCH_START":
            self.model.register_forward_hook(lambda m, i, out: self.hooked_outputs.append(out))


class PredictionsOnDevice(Trainer):
    """Validation keeps every prediction on the device until the next validation starts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.predictions: list[torch.Tensor] = []

    def validation_mode(self) -> AbstractContextManager[Any]:
        self.predictions = []
        return super().validation_mode()

    def validate_step(self, batch: Batch, acc: Any) -> torch.Tensor:
        prediction = super().validate_step(batch, acc)
        self.predictions.append(prediction)
        return prediction


def gather(tensor: torch.Tensor, world_size: int) -> list[torch.Tensor]:
    """``tensor`` from every rank, in rank order (``[tensor]`` in a one-process run)."""
    if world_size == 1:
        return [tensor]
    gathered = [torch.empty_like(tensor) for _ in range(world_size)]
    dist.all_gather(gathered, tensor.contiguous())
    return gathered


class Rank0Gather(Trainer):
    """Rank 0 collects every validation batch's predictions, targets and attention from all
    ranks (for an interpretation plot at the end) and never lets them go; the other ranks
    gather and drop them, so only rank 0 grows."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gathered: list[list[torch.Tensor]] = []

    def validate_step(self, batch: Batch, acc: Any) -> torch.Tensor:
        prediction, seen = self.model(batch, interpret=True)
        assert isinstance(seen, Interpretation)
        self.score(prediction, batch, acc)
        for tensor in (prediction, batch["target"], seen.attention, seen.encoder_weights):
            everyone = gather(tensor, self.world_size)
            if self.rank == 0:
                self.gathered.append(everyone)
        return prediction


class MetricSyncKeep(Trainer):
    """A validation metric keeps each batch's predictions and targets as list states and syncs
    them on every step (as a metric with ``dist_sync_on_step`` does), keeping the gathered
    copies from every rank in place of its own: every rank grows, world-size times as fast as
    the metric's own states would."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.metric_states: list[torch.Tensor] = []

    def validate_step(self, batch: Batch, acc: Any) -> torch.Tensor:
        prediction = super().validate_step(batch, acc)
        for state in (prediction, batch["target"]):
            self.metric_states.extend(gather(state, self.world_size))
        return prediction


class KeptWindows(Dataset[Batch]):
    """Windows that keep a copy of every window they produce, in the process that produces it."""

    def __init__(self, data: Windows) -> None:
        self.data = data
        self.kept: list[Batch] = []

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> Batch:
        window = {k: v.clone() for k, v in self.data[index].items()}
        self.kept.append(window)
        return window


class WorkerCache(Trainer):
    """The dataset keeps every window it produces: each DataLoader worker grows with every
    batch it makes (and, with persistent workers, from epoch to epoch), while the training
    process stays flat."""

    def dataset(self, data: Windows) -> Windows:
        return KeptWindows(data)


@dataclass(frozen=True)
class Fault:
    """A named bug: a trainer subclass carrying it, or the config fields it sets; a fault that
    lives in DataLoader workers ``needs_workers``."""

    name: str
    summary: str
    trainer: type[Trainer] | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    needs_workers: bool = False


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault(
            "val-attention-cache",
            "validation keeps every batch's attention (graph attached) until the loop ends",
            ValAttentionCache,
        ),
        Fault(
            "val-batch-32",
            "the validation batch size is hard-coded to 32 instead of following the batch size",
            config={"validation_batch_size": 32},
        ),
        Fault(
            "keep-optimizer", "the optimizer state is not released before validation", KeepOptimizer
        ),
        Fault(
            "param-store-ref",
            "a class-level store keeps every trainer's parameters after the session",
            ParamStoreRef,
        ),
        Fault(
            "qat-lr-stale",
            "the QAT schedule updates the trainer's lr field, not the optimizer's",
            QatLrStale,
        ),
        Fault(
            "loss-accumulate",
            "a running loss is summed as a tensor with its graph attached",
            LossAccumulate,
        ),
        Fault(
            "hook-per-epoch",
            "a forward hook storing outputs is added each epoch and never removed",
            HookPerEpoch,
        ),
        Fault(
            "predictions-on-device",
            "validation predictions are kept on the device for the whole epoch",
            PredictionsOnDevice,
        ),
    )
}


DISTRIBUTED_FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault(
            "rank0-gather",
            "rank 0 keeps every validation batch gathered from all ranks (DDP)",
            Rank0Gather,
        ),
        Fault(
            "metric-sync-keep",
            "a metric syncs its states every step and keeps every rank's copies (DDP)",
            MetricSyncKeep,
        ),
    )
}
WORKER_FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault(
            "worker-cache",
            "the dataset keeps every window it makes inside the DataLoader workers",
            WorkerCache,
            needs_workers=True,
        ),
    )
}
CATALOGUE: dict[str, Fault] = {**FAULTS, **DISTRIBUTED_FAULTS, **WORKER_FAULTS}
"""Every fault by name: the one-process ones, the distributed ones and the workers' ones."""


def get(names: Iterable[str]) -> list[Fault]:
    """The faults named, in order, each once; an unknown name is a ValueError listing them all."""
    faults: list[Fault] = []
    for name in names:
        if name not in CATALOGUE:
            raise ValueError(f"unknown fault {name!r}; known faults: {', '.join(CATALOGUE)}")
        if CATALOGUE[name] not in faults:
            faults.append(CATALOGUE[name])
    return faults


def trainer_class(names: Iterable[str]) -> type[Trainer]:
    """A trainer class carrying every named fault (``Trainer`` itself when none is a subclass)."""
    bases = tuple(f.trainer for f in get(names) if f.trainer is not None)
    if not bases:
        return Trainer
    return type("Faulty" + "".join(b.__name__ for b in bases), bases, {})


def configure(config: TrainConfig, names: Iterable[str]) -> TrainConfig:
    """``config`` with the fields the named faults set; a ValueError when a fault that lives in
    DataLoader workers is asked for without any."""
    for fault in get(names):
        if fault.needs_workers and config.num_workers < 1:
            raise ValueError(
                f"fault {fault.name!r} lives in DataLoader workers: it needs num_workers >= 1 "
                "(--num-workers)"
            )
        config = replace(config, **fault.config)
    return config


def build_trainer(
    model: TemporalFusionTransformer,
    config: TrainConfig | None = None,
    callbacks: Iterable[Callback] = (),
    faults: Sequence[str] = (),
) -> Trainer:
    """A trainer with the named faults injected (a plain :class:`Trainer` without any)."""
    return trainer_class(faults)(model, configure(config or TrainConfig(), faults), callbacks)


def reset() -> None:
    """Drop what faults keep beyond a trainer's life (the ``param-store-ref`` store)."""
    ParamStoreRef.store.clear()


__all__ = [
    "CATALOGUE",
    "DISTRIBUTED_FAULTS",
    "FAULTS",
    "WORKER_FAULTS",
    "Fault",
    "HookPerEpoch",
    "KeepOptimizer",
    "KeptWindows",
    "LossAccumulate",
    "MetricSyncKeep",
    "ParamStoreRef",
    "PredictionsOnDevice",
    "QatLrStale",
    "Rank0Gather",
    "ValAttentionCache",
    "WorkerCache",
    "build_trainer",
    "configure",
    "gather",
    "get",
    "reset",
    "trainer_class",
]

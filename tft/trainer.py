"""Train and validate a TFT, reporting named memory checkpoints to callbacks.

One epoch, with the checkpoint each callback receives (``phase`` in brackets)::

    EPOCH_START, TRAIN_BATCH x N, AFTER_TRAINING                         [training]
    BEFORE_VALIDATION (optimizer state released), VALIDATION_START,
    VALIDATION_BATCH x M, VALIDATION_END, AFTER_VALIDATION (restored)    [validation]
    CHECKPOINT_SAVED (when a checkpoint dir is set), EPOCH_END           [epoch]

framed by SESSION_START and SESSION_END [session]. A callback is called as
``callback(label, phase=..., epoch=..., batch=...)``, and for an out-of-memory error as
``callback("OOM", phase=..., epoch=..., batch=..., note=message)``.

Under ``torch.distributed`` (an initialised default process group of more than one rank, as
``torchrun`` gives ``python -m tft.train``) the trainer runs DDP: training goes through
``DistributedDataParallel``, each rank takes its share of every epoch's windows (as
``DistributedSampler`` splits them: padded by repeating windows so every rank has as many
batches; repeated validation windows are not scored), validation sums and the training loss
are reduced across ranks, and only rank 0 writes checkpoints (the others wait for it). After
each batch the ranks agree whether any ran out of memory, so every rank backs off together
(the rank that failed reports the ``OOM`` checkpoint) and their collectives stay matched; an
out-of-memory error inside the gradient synchronisation itself cannot be recovered from.
"""

from __future__ import annotations

import gc
import logging
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tft import ddp
from tft.checkpoint import CheckpointError, read_checkpoint
from tft.config import TrainConfig, resolve_device
from tft.ddp import shard, world
from tft.loading import Batch, Loader, Windows
from tft.model import TemporalFusionTransformer, pinball, quantile_loss
from tft.qat import prepare_qat, qat_schedule
from tft.scoring import Accumulator, baseline_q_risk

__all__ = [
    "Accumulator",
    "Batch",
    "Callback",
    "EpochStats",
    "TrainConfig",
    "Trainer",
    "TrainingOOM",
    "Windows",
    "baseline_q_risk",
    "resolve_device",
    "shard",
    "world",
]

log = logging.getLogger(__name__)

Callback = Callable[..., Any]


class TrainingOOM(torch.OutOfMemoryError):
    """Out of memory after every allowed batch-size halving."""


@dataclass
class EpochStats:
    """Bounded, detached summary of one epoch."""

    epoch: int
    train_loss: float
    val_loss: float
    q_risk: list[float]
    batch_size: int
    validation_batch_size: int
    lr: float


@dataclass
class _State:
    """What changes during a session: batch sizes after back-off, retries spent, the epoch."""

    batch_size: int
    validation_batch_size: int
    retries: int = 0
    epoch: int = 0
    history: list[EpochStats] = field(default_factory=list)


class Trainer:
    """Fit a TFT on window datasets; the trainer owns the optimizer and nothing else of the model.

    Subclasses may override :meth:`dataset`, :meth:`train_step`, :meth:`training_loss`,
    :meth:`step_schedule`, :meth:`validate_step`, :meth:`validation_mode`,
    :meth:`release_optimizer` and :meth:`restore_optimizer`; the loop, back-off and checkpoints
    stay here. With ``config.num_workers``, DataLoader workers make the batches
    (:mod:`tft.loading`).
    """

    def __init__(
        self,
        model: TemporalFusionTransformer,
        config: TrainConfig | None = None,
        callbacks: Iterable[Callback] = (),
    ) -> None:
        self.config = config or TrainConfig()
        self.device = resolve_device(self.config.device)
        if self.config.qat:
            prepare_qat(model)
        self.model = model.to(self.device)
        self.rank, self.world_size = world()
        self.network = ddp.wrap(self.model, self.device, self.world_size)
        self.quantiles = tuple(model.config.quantiles)
        self.callbacks = list(callbacks)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.config.lr, fused=True)
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        self.state = _State(
            self.config.batch_size, self.config.validation_batch_size or self.config.batch_size
        )
        self._offloaded: list[dict[str, tuple[torch.device | None, Any]]] | None = None
        self._steps_per_epoch = 0
        self._loaders: dict[str, tuple[Windows, Loader]] = {}

    # -- public ---------------------------------------------------------------------------------

    @property
    def history(self) -> list[EpochStats]:
        return self.state.history

    def fit(self, train: Windows, val: Windows) -> list[EpochStats]:
        """Train for the configured epochs (continuing after a resumed checkpoint)."""
        if len(train) == 0 or len(val) == 0:
            raise ValueError(f"empty dataset: {len(train)} training, {len(val)} validation windows")
        if self.config.qat and self.scheduler is None:
            self._start_schedule(math.ceil(len(train) / self.config.batch_size))
        # Subnormal floats appear in the optimizer state within a few hundred steps and make CPU
        # kernels over ten times slower (200-350 ms instead of 12 ms per batch-1 step, measured).
        # Flushing them is process-wide, so it lasts only as long as the fit (torch's default,
        # off, comes back after).
        torch.set_flush_denormal(True)
        try:
            self.emit("SESSION_START", "session")
            while self.state.epoch < self.config.epochs:
                self._run_epoch(train, val)
            self.emit("SESSION_END", "session")
        finally:
            torch.set_flush_denormal(False)
            self._loaders.clear()  # persistent workers stop with their loaders
        return self.history

    def emit(self, label: str, phase: str, batch: int | None = None, **extra: Any) -> None:
        """Call every callback at a named checkpoint (session checkpoints carry no epoch)."""
        epoch = None if phase == "session" else self.state.epoch
        for callback in self.callbacks:
            callback(label, phase=phase, epoch=epoch, batch=batch, **extra)

    def dataset(self, data: Windows) -> Windows:
        """The dataset a phase's batches are read from: ``data`` itself."""
        return data

    def train_step(self, batch: Batch) -> torch.Tensor:
        """One optimisation step; returns the detached loss."""
        loss = self.training_loss(batch)
        loss.backward()
        if self.config.grad_clip:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step_schedule()
        return loss.detach()

    def training_loss(self, batch: Batch) -> torch.Tensor:
        """The loss of one training batch, with its graph (through DDP when distributed)."""
        return quantile_loss(self.network(batch), batch["target"], self.quantiles)

    def step_schedule(self) -> None:
        """Advance the learning-rate schedule (QAT) by one optimizer step."""
        if self.scheduler is not None:
            self.scheduler.step()

    def validation_mode(self) -> AbstractContextManager[Any]:
        """The autograd mode validation runs in: inference mode, so no graph is recorded."""
        return torch.inference_mode()

    def validate_step(self, batch: Batch, acc: Accumulator) -> torch.Tensor:
        """Score one batch into the bounded accumulator (its padding rows left out); returns
        the prediction."""
        prediction = self.model(batch)
        self.score(prediction, batch, acc)
        return prediction

    def score(self, prediction: torch.Tensor, batch: Batch, acc: Accumulator) -> None:
        """Add a batch's prediction to the accumulator, leaving its padding rows out."""
        scored = len(batch["target"]) - acc.padding
        if scored > 0:
            target, predicted = batch["target"][:scored], prediction[:scored]
            loss = quantile_loss(predicted, target, self.quantiles)
            acc.add(
                loss,
                pinball(predicted, target, self.quantiles).flatten(0, -2).sum(0),
                target.abs().sum(),
                scored,
            )

    def release_optimizer(self) -> None:
        """Move the optimizer state off the device before validation (CPU: kept as is)."""
        self._offloaded = []
        for group in self.optimizer.param_groups:
            for param in group["params"]:
                state = self.optimizer.state.pop(param, {})
                self._offloaded.append(
                    {
                        k: (v.device, v.to("cpu")) if torch.is_tensor(v) else (None, v)
                        for k, v in state.items()
                    }
                )
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def restore_optimizer(self) -> None:
        """Bring the released optimizer state back exactly as it was."""
        if self._offloaded is None:
            return
        saved = iter(self._offloaded)
        for group in self.optimizer.param_groups:
            for param in group["params"]:
                state = next(saved)
                if state:
                    self.optimizer.state[param] = {
                        k: v.to(device) if device is not None else v
                        for k, (device, v) in state.items()
                    }
        self._offloaded = None

    def save_checkpoint(self, path: str | os.PathLike[str]) -> Path:
        """Write model, optimizer, schedule and progress atomically; loadable with weights_only."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler else None,
            "steps_per_epoch": self._steps_per_epoch,
            "state": {
                "batch_size": self.state.batch_size,
                "validation_batch_size": self.state.validation_batch_size,
                "retries": self.state.retries,
                "epoch": len(self.history),
            },
            "history": [asdict(h) for h in self.history],
            "rng": torch.get_rng_state(),
        }
        tmp = path.with_name(f".{path.name}.tmp")
        torch.save(payload, tmp)
        os.replace(tmp, path)
        return path

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Resume from :meth:`save_checkpoint` output; never unpickles arbitrary objects.

        Raises :class:`~tft.checkpoint.CheckpointError` for a file that is not such a checkpoint
        or does not fit this trainer's model (then nothing is loaded) or its optimizer.
        """
        payload = read_checkpoint(path, self.model, self.device)
        try:
            state = _State(
                **payload["state"], history=[EpochStats(**h) for h in payload["history"]]
            )
            self.model.load_state_dict(payload["model"])
            self.optimizer.load_state_dict(payload["optimizer"])
            if payload["scheduler"] is not None:
                self._start_schedule(payload["steps_per_epoch"], payload["scheduler"])
            torch.set_rng_state(payload["rng"].cpu())
        except (AttributeError, KeyError, TypeError, ValueError, RuntimeError) as exc:
            problem = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CheckpointError(f"{path}: does not fit this trainer ({problem})") from None
        self.state = state

    def _start_schedule(self, steps_per_epoch: int, saved: dict[str, Any] | None = None) -> None:
        """The QAT learning-rate schedule, written into the optimizer's param groups."""
        self._steps_per_epoch = steps_per_epoch
        factor = qat_schedule(
            self.config.epochs * steps_per_epoch, self.config.qat_warmup, self.config.qat_cooldown
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, factor)
        if saved is not None:
            self.scheduler.load_state_dict(saved)
            for group, lr in zip(
                self.optimizer.param_groups, self.scheduler.get_last_lr(), strict=True
            ):
                group["lr"] = lr

    # -- the loop -------------------------------------------------------------------------------

    def _run_epoch(self, train: Windows, val: Windows) -> None:
        epoch = self.state.epoch
        torch.manual_seed(self.config.seed * 1000 + epoch)
        self.model.train()
        self.emit("EPOCH_START", "training")
        order = torch.randperm(
            len(train), generator=torch.Generator().manual_seed(self.config.seed + epoch)
        )
        losses: list[float] = []

        def step(batch: Batch, index: int, rows: range) -> None:
            losses.append(float(self.train_step(batch)))
            self.emit("TRAIN_BATCH", "training", index)

        share, _ = shard(order.tolist(), self.rank, self.world_size)
        self._batches(train, share, "training", step)
        train_loss = ddp.mean(losses, self.device, self.world_size)
        self.emit("AFTER_TRAINING", "training")

        self.release_optimizer()
        self.emit("BEFORE_VALIDATION", "validation")
        val_loss, q_risk = self._validate(val)
        self.restore_optimizer()
        self.emit("AFTER_VALIDATION", "validation")

        self.state.history.append(
            EpochStats(
                epoch=epoch,
                train_loss=train_loss,
                val_loss=val_loss,
                q_risk=q_risk,
                batch_size=self.state.batch_size,
                validation_batch_size=self.state.validation_batch_size,
                lr=self.optimizer.param_groups[0]["lr"],
            )
        )
        if self.config.checkpoint_dir:
            directory = Path(self.config.checkpoint_dir)
            if self.rank == 0:
                self.save_checkpoint(directory / f"epoch-{epoch}.pt")
                self.save_checkpoint(directory / "last.pt")
            ddp.barrier(self.device, self.world_size)
            self.emit("CHECKPOINT_SAVED", "epoch")
        self.emit("EPOCH_END", "epoch")
        self.state.epoch += 1

    def _validate(self, val: Windows) -> tuple[float, list[float]]:
        self.model.eval()
        acc = Accumulator()
        self.emit("VALIDATION_START", "validation")
        share, real = shard(range(len(val)), self.rank, self.world_size)

        def step(batch: Batch, index: int, rows: range) -> None:
            acc.padding = len([r for r in rows if r >= real])
            self.validate_step(batch, acc)
            self.emit("VALIDATION_BATCH", "validation", index)

        with self.validation_mode():
            self._batches(val, share, "validation", step)
        acc.padding = 0
        if self.world_size > 1:
            acc.reduce(len(self.quantiles), self.device)
        self.emit("VALIDATION_END", "validation")
        self.model.train()
        return acc.result()

    def _batches(
        self,
        data: Windows,
        order: Sequence[int],
        phase: str,
        step: Callable[[Batch, int, range], None],
    ) -> None:
        """Run ``step(batch, index, rows)`` over ``order`` in batches (``rows``: the batch's
        positions in ``order``), halving the batch size on out-of-memory; distributed, every
        rank backs off when any rank ran out, and the batches start again from the first that
        did not run at the smaller size."""
        size_field = "batch_size" if phase == "training" else "validation_batch_size"
        start, index = 0, 0
        batches: Iterator[Batch] | None = None
        while start < len(order):
            size = getattr(self.state, size_field)
            failure = None
            batch: Batch | None = None
            try:
                if batches is None:
                    seed = self.config.seed * 1000 + self.state.epoch
                    batches = self._loader(phase, data).batches(order[start:], size, seed)
                batch = next(batches)
                step(batch, index, range(start, min(start + size, len(order))))
            except torch.OutOfMemoryError as exc:
                failure = (
                    str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                )
            batch = None
            failed = ddp.failed_ranks(failure is not None, self.rank, self.world_size, self.device)
            if not failed:
                start, index = start + size, index + 1
                continue
            batches = None
            if failure is None:
                failure = f"rank {', '.join(map(str, failed))} ran out of memory"
            self._back_off(phase, index, size_field, failure, here=self.rank in failed)

    def _loader(self, phase: str, data: Windows) -> Loader:
        """The phase's loader of ``data``, kept while the phase reads the same dataset (so that
        persistent workers live from epoch to epoch) and until the fit ends."""
        kept = self._loaders.get(phase)
        if kept is None or kept[0] is not data:
            workers, persistent = self.config.num_workers, self.config.persistent_workers
            loader = Loader(self.dataset(data), self.device, workers, persistent=persistent)
            kept = self._loaders[phase] = (data, loader)
        return kept[1]

    def _back_off(
        self, phase: str, index: int, size_field: str, failure: str, *, here: bool = True
    ) -> None:
        if here:
            self.emit("OOM", phase, index, note=failure)
        self.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        size = getattr(self.state, size_field)
        if size == 1 or self.state.retries >= self.config.oom_retries:
            raise TrainingOOM(
                f"Training OOM after {self.state.retries} retries (final batch_size={size}) "
                f"in {phase}, epoch {self.state.epoch}, batch {index}: {failure}"
            )
        self.state.retries += 1
        setattr(self.state, size_field, max(1, size // 2))
        log.warning(
            "out of memory in %s batch %d: %s; %s -> %d",
            phase,
            index,
            failure,
            size_field,
            size // 2,
        )

"""Trainer invariants checked at named checkpoints: the faults that memory cannot show.

A :class:`TrainerChecks` is a trainer callback. It verifies

- ``optimizer-released``: the optimizer holds no state from ``BEFORE_VALIDATION`` to
  ``VALIDATION_END`` (on a CPU, releasing the state to the host frees nothing, so memory
  readings cannot tell whether it happened);
- ``lr-follows-schedule``: after each training step, every param group's learning rate is the
  one the trainer's schedule prescribes for the steps taken (QAT only),

and reports each broken invariant, once per epoch, to a sink called as
``sink(CHECK_FAILED, phase=..., epoch=..., batch=..., note=...)``: a ``harness.Recorder`` is
such a sink, and any callable with that signature will do (``tft`` does not import harness).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

from tft.trainer import Trainer

CHECK_FAILED = "CHECK_FAILED"
RELEASED_FROM = "BEFORE_VALIDATION"
RELEASED_UNTIL = "VALIDATION_END"

Sink = Callable[..., Any]


class TrainerChecks:
    """Verify ``trainer``'s invariants at its checkpoints; report failures to ``sink``.

    Holds the trainer weakly, so being one of its callbacks keeps nothing alive. ``failures``
    lists every note reported.
    """

    def __init__(self, trainer: Trainer, sink: Sink) -> None:
        self._trainer = weakref.ref(trainer)
        self.sink = sink
        self.failures: list[str] = []
        self._reported: set[tuple[str, int | None]] = set()
        self._released = False

    def __call__(
        self, label: str, *, phase: str, epoch: int | None, batch: int | None, **_: Any
    ) -> None:
        trainer = self._trainer()
        if trainer is None:
            return
        if label == RELEASED_FROM:
            self._released = True
        if self._released:
            held = sum(1 for state in trainer.optimizer.state.values() if state)
            if held:
                self.fail(
                    "optimizer-released",
                    f"optimizer state held for {held} parameters at {label}",
                    phase,
                    epoch,
                    batch,
                )
        if label == RELEASED_UNTIL:
            self._released = False
        if label == "TRAIN_BATCH" and trainer.scheduler is not None:
            scheduler = trainer.scheduler
            for i, group in enumerate(trainer.optimizer.param_groups):
                want = scheduler.base_lrs[i] * scheduler.lr_lambdas[i](scheduler.last_epoch)
                if not math.isclose(group["lr"], want, rel_tol=1e-9):
                    self.fail(
                        "lr-follows-schedule",
                        f"param group {i} lr {group['lr']:.4g} != scheduled {want:.4g} "
                        f"after {scheduler.last_epoch} steps",
                        phase,
                        epoch,
                        batch,
                    )
                    break

    def fail(
        self, invariant: str, detail: str, phase: str, epoch: int | None, batch: int | None
    ) -> None:
        """Report ``invariant`` broken, unless it was already reported this epoch."""
        if (invariant, epoch) in self._reported:
            return
        self._reported.add((invariant, epoch))
        note = f"{invariant}: {detail}"
        self.failures.append(note)
        self.sink(CHECK_FAILED, phase=phase, epoch=epoch, batch=batch, note=note)


def watch(trainer: Trainer, sink: Sink) -> TrainerChecks:
    """Attach a :class:`TrainerChecks` to ``trainer``'s callbacks and return it."""
    checks = TrainerChecks(trainer, sink)
    trainer.callbacks.append(checks)
    return checks

"""What ``python -m tft.train`` tells a person while it trains: a progress bar (or quartile log
lines off a terminal) and one summary line per epoch."""

from __future__ import annotations

import logging
import math
import resource
import sys
from typing import Any, TextIO

import torch

from tft.trainer import EpochStats, Trainer

log = logging.getLogger("tft.train")


class Progress:
    """A per-epoch progress line on a terminal (quartile log lines otherwise), and a summary
    line at the end of each epoch."""

    def __init__(self, trainer: Trainer, n_train: int, n_val: int, stream: TextIO) -> None:
        self.trainer, self.stream = trainer, stream
        world = trainer.world_size
        self.totals = {
            "training": math.ceil(n_train / world),
            "validation": math.ceil(n_val / world),
        }
        self.tty = stream.isatty()
        self.last_quarter = -1

    def __call__(self, label: str, *, phase: str, epoch: int, batch: int | None, **_: Any) -> None:
        if label == "EPOCH_END":
            stats = self.trainer.history[-1]
            log.info(format_epoch(stats, self.trainer.config.epochs, self.trainer.device))
            return
        if label not in ("TRAIN_BATCH", "VALIDATION_BATCH") or batch is None:
            return
        state = self.trainer.state
        size = state.batch_size if phase == "training" else state.validation_batch_size
        total = self.totals[phase]
        done = min(total, (batch + 1) * size)
        head = f"epoch {epoch + 1}/{self.trainer.config.epochs} {phase}"
        if self.tty:
            width = 30
            bar = "#" * (width * done // total)
            end = "\n" if done == total else ""
            self.stream.write(f"\r{head} [{bar:<{width}}] {done}/{total}{end}")
            self.stream.flush()
            return
        quarter = 4 * done // total
        if quarter != self.last_quarter:
            self.last_quarter = quarter
            log.info("%s %d/%d windows", head, done, total)


def memory_summary(device: torch.device) -> str:
    if device.type == "cuda":
        alloc = torch.cuda.memory_allocated(device) / 2**20
        reserved = torch.cuda.memory_reserved(device) / 2**20
        return f"cuda allocated {alloc:.1f}MB reserved {reserved:.1f}MB"
    scale = 1 if sys.platform == "darwin" else 1024
    return f"cpu max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20:.1f}MB"


def format_epoch(stats: EpochStats, epochs: int, device: torch.device) -> str:
    risks = " ".join(f"{r:.3f}" for r in stats.q_risk)
    return (
        f"epoch {stats.epoch + 1}/{epochs}: train loss {stats.train_loss:.4f}, "
        f"val loss {stats.val_loss:.4f}, q-risk [{risks}], {memory_summary(device)}"
    )

"""How to train: :class:`TrainConfig`, its checks, and the device a name stands for."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TrainConfig:
    """How to train. ``validation_batch_size`` defaults to ``batch_size``. ``num_workers``
    DataLoader worker processes make the batches (0: the training process makes them), and
    ``persistent_workers`` keeps them from epoch to epoch."""

    batch_size: int = 1
    validation_batch_size: int | None = None
    epochs: int = 5
    lr: float = 1e-3
    device: str = "auto"
    seed: int = 0
    grad_clip: float | None = 1.0
    qat: bool = False
    qat_warmup: float = 0.1
    qat_cooldown: float = 0.3
    checkpoint_dir: str | None = None
    oom_retries: int = 3
    num_workers: int = 0
    persistent_workers: bool = False

    def __post_init__(self) -> None:
        if self.validation_batch_size is None:
            self.validation_batch_size = self.batch_size
        for name in ("batch_size", "validation_batch_size", "epochs"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr!r}")
        if self.oom_retries < 0:
            raise ValueError(f"oom_retries must be >= 0, got {self.oom_retries!r}")
        if not (0 <= self.qat_warmup <= 1 and 0 <= self.qat_cooldown <= 1):
            raise ValueError("qat_warmup and qat_cooldown are fractions of the steps, in [0, 1]")
        check_workers(self.num_workers, self.persistent_workers)
        resolve_device(self.device)


MAX_WORKERS = 64
"""The most DataLoader workers a run may start: each is a process, and more would not feed one
trainer any faster."""


def check_workers(num_workers: object, persistent: object) -> None:
    """``TypeError`` for a count that is not an int or a flag that is not a bool; ``ValueError``
    for a count outside 0..:data:`MAX_WORKERS`, or persistent workers without any."""
    if isinstance(num_workers, bool) or not isinstance(num_workers, int):
        raise TypeError(f"num_workers must be an int, got {num_workers!r}")
    if not isinstance(persistent, bool):
        raise TypeError(f"persistent_workers must be a bool, got {persistent!r}")
    if not 0 <= num_workers <= MAX_WORKERS:
        raise ValueError(f"num_workers must be from 0 to {MAX_WORKERS}, got {num_workers}")
    if persistent and num_workers == 0:
        raise ValueError("persistent_workers needs num_workers >= 1")


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when visible, else CPU; anything torch cannot parse is a ValueError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"unknown device {name!r} (use auto, cpu, cuda or cuda:N)") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return device

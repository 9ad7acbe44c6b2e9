"""Which rank a process is in a distributed run (``torch.distributed``, DDP under
``torchrun``): from an initialised default process group, else from the variables a launcher
sets. A :class:`~harness.recorder.Recorder` writes it into its timeline header."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RankInfo:
    """Where a process stands in a distributed run. ``backend`` is the process group's
    (``gloo``, ``nccl``), or None when the group was not initialised yet."""

    rank: int
    world_size: int
    local_rank: int | None = None
    backend: str | None = None

    def to_header(self) -> dict[str, Any]:
        """The timeline header's fields."""
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": self.local_rank,
            "backend": self.backend,
        }


def rank_info(environ: Mapping[str, str] | None = None) -> RankInfo | None:
    """This process's rank: from an initialised default process group, else from ``RANK``
    (or ``LOCAL_RANK``) and ``WORLD_SIZE``; None for a process that is not one of several.

    Raises ``ValueError`` naming the variable when one is set but is not a rank in range."""
    env = os.environ if environ is None else environ
    local = _whole(env, "LOCAL_RANK")
    try:
        import torch.distributed as dist
    except ImportError:  # a torch built without distributed support
        dist = None  # type: ignore[assignment]
    if environ is None and dist is not None and dist.is_available() and dist.is_initialized():
        return RankInfo(dist.get_rank(), dist.get_world_size(), local, str(dist.get_backend()))
    world = _whole(env, "WORLD_SIZE")
    rank = _whole(env, "RANK")
    rank = local if rank is None else rank
    if world is None or rank is None:
        return None
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"RANK/WORLD_SIZE: rank {rank} is not in a world of size {world}")
    return RankInfo(rank, world, local, None)


def _whole(env: Mapping[str, str], name: str) -> int | None:
    text = env.get(name)
    if text is None or not text.strip():
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name}: expected a whole number, got {text[:40]!r}") from None

"""Which rank a process is in a distributed run (``torch.distributed``, DDP under
``torchrun``): from an initialised default process group, else from the variables a launcher
sets. A :class:`~harness._recorder.Recorder` writes it into its timeline header.

:func:`check_world_size` and :func:`check_rank` are the one check of those numbers, whoever
gives them: a launcher's variables, a timeline header read back, ``leakgate merge
--world-size``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness._core.errors import BadArgument, BadInput

if TYPE_CHECKING:
    from harness._core.records import RankFields

MAX_WORLD_SIZE = 1 << 20
"""The most ranks a run may have: far above the largest jobs (about 10**5 GPUs), far below a
number that would exhaust memory when every rank is listed."""


@dataclass(frozen=True)
class RankInfo:
    """Where a process stands in a distributed run. ``backend`` is the process group's
    (``gloo``, ``nccl``), or None when the group was not initialised yet."""

    rank: int
    world_size: int
    local_rank: int | None = None
    backend: str | None = None

    def to_header(self) -> RankFields:
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
    try:
        check_rank(rank, check_world_size(world))
    except ValueError as exc:
        raise BadInput(str(exc), field="RANK/WORLD_SIZE") from None
    return RankInfo(rank, world, local, None)


def check_world_size(value: Any) -> int:
    """``value`` when it is a whole number of ranks, 1 to :data:`MAX_WORLD_SIZE`.

    Raises :class:`~harness._core.errors.BadArgument` for anything but an ``int`` (a bool
    included) and for one out of range; both say ``world size``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadArgument(f"world size: expected a whole number, got {_shown(value)}")
    if not 1 <= value <= MAX_WORLD_SIZE:
        raise BadArgument(f"world size {_shown(value)} is not from 1 to {MAX_WORLD_SIZE}")
    return value


def check_rank(value: Any, world_size: int) -> int:
    """``value`` when it is a rank of a world of ``world_size`` (a checked one): 0 to
    ``world_size - 1``. Raises :class:`~harness._core.errors.BadArgument` for anything but an
    ``int`` and for one out of range."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadArgument(f"rank: expected a whole number, got {_shown(value)}")
    if not 0 <= value < world_size:
        raise BadArgument(f"rank {_shown(value)} is not in a world of size {world_size}")
    return value


def _shown(value: Any) -> str:
    """A short form of ``value`` for a message (a huge number is not spelled out)."""
    text = repr(value)
    return text if len(text) <= 24 else text[:20] + "..."


def _whole(env: Mapping[str, str], name: str) -> int | None:
    text = env.get(name)
    if text is None or not text.strip():
        return None
    try:
        return int(text)
    except ValueError:
        raise BadInput(f"expected a whole number, got {text[:40]!r}", field=name) from None

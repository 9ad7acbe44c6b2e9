"""The trainer's collectives under ``torch.distributed``: this process's rank, its share of a
phase's windows, and the sums, flags and barriers every rank takes part in.

Every function here is a no-op (or the one-process answer) when the world is one rank, so the
trainer calls them unconditionally.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def world() -> tuple[int, int]:
    """``(rank, world size)`` of the default process group; ``(0, 1)`` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def shard(indices: Sequence[int], rank: int, world_size: int) -> tuple[list[int], int]:
    """This rank's share of ``indices`` as ``DistributedSampler`` splits them: padded by
    repeating from the start to a multiple of ``world_size``, then every ``world_size``-th from
    ``rank``. Returns the share and how many of its first entries are not padding."""
    n = len(indices)
    if world_size == 1 or n == 0:
        return list(indices), n
    total = math.ceil(n / world_size) * world_size
    padded = list(indices) * math.ceil(total / n)
    share = padded[rank:total:world_size]
    return share, len(range(rank, n, world_size))


def device_ids(device: torch.device) -> list[int] | None:
    """This rank's CUDA device, as DDP and NCCL's barrier take it (None on the CPU)."""
    if device.type != "cuda":
        return None
    return [device.index if device.index is not None else torch.cuda.current_device()]


def wrap(model: nn.Module, device: torch.device, world_size: int) -> nn.Module:
    """``model`` through ``DistributedDataParallel`` on more than one rank, else itself."""
    if world_size == 1:
        return model
    return DistributedDataParallel(model, device_ids=device_ids(device))


def barrier(device: torch.device, world_size: int) -> None:
    """Wait for every rank (nothing to wait for in a one-process run)."""
    if world_size > 1:
        dist.barrier(device_ids=device_ids(device))


def mean(values: Sequence[float], device: torch.device, world_size: int) -> float:
    """The mean of ``values`` over every rank's (0 when no rank has any)."""
    total, count = sum(values), len(values)
    if world_size > 1:
        sums = torch.tensor([total, float(count)], dtype=torch.float64, device=device)
        dist.all_reduce(sums)
        total, count = float(sums[0]), round(float(sums[1]))
    return total / max(1, count)


def failed_ranks(failed: bool, rank: int, world_size: int, device: torch.device) -> list[int]:
    """The ranks where the last batch ran out of memory (this one's ``failed`` included)."""
    if world_size == 1:
        return [0] if failed else []
    flags = torch.zeros(world_size, device=device)
    flags[rank] = float(failed)
    dist.all_reduce(flags)
    return [r for r, flag in enumerate(flags.tolist()) if flag]

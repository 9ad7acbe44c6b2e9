"""Allocation sites from the device allocator's own history, the one device-specific source of
attribution: with torch's CUDA allocation history recorded (:func:`record_sites`), each block
in use carries the Python stack that allocated it; :func:`allocator_blocks` reads the blocks in
use, keyed as storages are, and :func:`site_of` reduces a stack to the ``file:line`` a person
would edit. Without CUDA every function here does nothing."""

from __future__ import annotations

import os
from typing import Any

import torch

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep

Block = tuple[tuple[str, int | None, int], int, list[dict[str, Any]]]
"""``(storage key, size, frames)``: a block in use, keyed as
:func:`~harness._attribution.snapshot.storage_of` keys the storage it holds."""


def in_use() -> bool:
    """Whether the allocator whose history gives sites is in use in this process."""
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def record_sites(enabled: bool = True) -> bool:
    """Start (or stop) recording the Python stack of every CUDA allocation, which
    :func:`~harness._attribution.holders.attribute` turns into allocation sites; torch puts it at
    about 2 µs per allocation. A recording already on is left as it is. Returns whether
    recording was on before; without CUDA it does nothing and returns False."""
    if not torch.cuda.is_available():
        return False
    was_on = sites_recorded()
    if enabled and not was_on:
        torch.cuda.memory._record_memory_history("state", context="state", stacks="python")
    elif not enabled and was_on:
        torch.cuda.memory._record_memory_history(None)
    return was_on


def sites_recorded() -> bool:
    """Whether CUDA allocation stacks are being recorded now."""
    if not in_use():
        return False
    enabled = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    return bool(enabled()) if enabled is not None else False


def allocator_blocks() -> list[Block]:
    """Blocks in use on every CUDA device."""
    if not in_use():
        return []
    blocks = []
    for segment in torch.cuda.memory._snapshot()["segments"]:
        for block in segment["blocks"]:
            if block["state"] != "active_allocated":
                continue
            frames = block.get("frames")
            if frames is None:
                history = block.get("history") or [{}]
                frames = history[0].get("frames", [])
            key = ("cuda", segment.get("device", 0), block["address"])
            blocks.append((key, block["size"], frames))
    return blocks


def site_of(frames: list[dict[str, Any]]) -> str | None:
    """``file:line`` of the innermost frame outside torch (the innermost of all when every frame
    is torch's); ``None`` without frames (stacks not recorded)."""
    outside = [f for f in frames if not f["filename"].startswith((_TORCH_DIR, "<"))]
    if not (outside or frames):
        return None
    chosen = (outside or frames)[0]
    filename = chosen["filename"]
    here = os.getcwd() + os.sep
    if filename.startswith(here):
        filename = filename[len(here) :]
    return f"{filename}:{chosen['line']}"

"""``python -m tft.train`` under ``torchrun``: this rank's device, the default process group for
the run, and leaving the process once its work is written."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import torch
import torch.distributed as dist

from tft.config import TrainConfig, resolve_device


def rank_config(config: TrainConfig, environ: dict[str, str] | None = None) -> TrainConfig:
    """The config of this rank under ``torchrun``: on CUDA, device ``cuda:LOCAL_RANK`` (one rank
    per visible GPU); unchanged outside ``torchrun`` or on the CPU. ``ValueError`` for
    launcher variables that are not numbers, or more ranks on a node than visible GPUs."""
    env = os.environ if environ is None else environ
    if "WORLD_SIZE" not in env:
        return config
    try:
        world, local = int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", "0"))
    except ValueError:
        raise ValueError("WORLD_SIZE and LOCAL_RANK must be whole numbers") from None
    if world < 1 or local < 0:
        raise ValueError(f"WORLD_SIZE {world} and LOCAL_RANK {local} are not a rank")
    if resolve_device(config.device).type != "cuda":
        return replace(config, device="cpu")
    visible = torch.cuda.device_count()
    if local >= visible:
        raise ValueError(
            f"LOCAL_RANK {local}: only {visible} CUDA device(s) visible; run one rank per GPU "
            f"(--nproc-per-node {visible})"
        )
    return replace(config, device=f"cuda:{local}")


@contextmanager
def process_group(config: TrainConfig) -> Iterator[None]:
    """Under ``torchrun`` (``WORLD_SIZE`` set), join the default process group for the run,
    NCCL on CUDA and gloo on the CPU, and leave it after; nothing otherwise."""
    if "WORLD_SIZE" not in os.environ or dist.is_initialized():
        yield
        return
    device = resolve_device(config.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        yield
        # No rank leaves while another still talks to it (rank 0 merges the verdicts): a
        # group torn down under a peer's collective aborts that peer's process.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def leave(code: int) -> None:
    """Exit with ``code``. Under ``torchrun`` a rank leaves without the interpreter's C++
    teardown: with torch 2.13 a rank whose run finished, its process group destroyed, sometimes
    aborts there ("terminate called without an active exception": 4 of 24 two-rank runs on a
    loaded machine), which the launcher reports as a failed job. Output is flushed first."""
    if "WORLD_SIZE" not in os.environ:
        sys.exit(code)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)

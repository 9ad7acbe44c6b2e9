"""What torch keeps in C++ while one of its features is on, named as a holder of growth no Python
object holds: a recording profiler's events (kept until it stops) and autocast's cache of cast
weights (kept until the outermost autocast region exits). torch tells whether each is on; it
does not tell how much each keeps, so the first one on is given the growth left unexplained."""

from __future__ import annotations

import torch

from harness._attribution.holder import Holder

PROFILER = "<torch profiler>"
AUTOCAST = "<torch autocast cache>"


def profiler_recording() -> bool:
    """Whether a torch profiler records now (its events are kept until it stops)."""
    return bool(torch._C._autograd._profiler_enabled())


def torch_holders(unexplained: int) -> list[Holder]:
    """A holder for each C++ keeper that is on now, the first with ``unexplained`` bytes (the
    growth Python holders leave); none when nothing is left unexplained."""
    if unexplained <= 0:
        return []
    on = []
    if profiler_recording():
        on.append((PROFILER, "events in C++", "recording: its events live in C++ until it stops"))
    if torch.is_autocast_cache_enabled() and any(
        torch.is_autocast_enabled(device) for device in ("cpu", "cuda")
    ):
        on.append((AUTOCAST, "cast tensors in C++", "kept until the outermost region exits"))
    return [
        Holder(path, kind, 0, 0, unexplained if k == 0 else 0, note=note)
        for k, (path, kind, note) in enumerate(on)
    ]

"""176 batches of a small torch computation, as a pytest test under the leak checker that
``LOOP_TOOL`` names.

Tools: ``plain`` (none), ``leakgate`` (``memleak`` marker, a checkpoint after each batch) and
``memray`` (pytest-memray's ``limit_leaks``, run with ``--memray``). Both checkers get the same
limit, 1 MB: leakgate on a phase's growth, memray on what one call stack leaks.

Kinds: ``clean`` keeps nothing; ``kept`` appends each batch's 64 KiB output to a module-level
list, which outlives the test (a cache that grows for good); ``held`` appends it to a list the
test drops when it returns (the incident's validation loop, which cleared its list only after
the loop). ``warmup`` is ``clean`` run first, so the others do not pay for first-use imports.
"""

from __future__ import annotations

import os
from contextlib import nullcontext

import pytest
import torch

BATCHES = 176
TOOL = os.environ.get("LOOP_TOOL", "plain")
WEIGHT = torch.randn(256, 256)
KEPT: list[torch.Tensor] = []

torch.set_num_threads(1)
if TOOL == "leakgate":
    pytestmark = pytest.mark.memleak(phase="loop", max_growth="1MB")
elif TOOL == "memray":
    pytestmark = pytest.mark.limit_leaks("1 MB")


def step() -> torch.Tensor:
    """One batch: a [64, 256] float32 output, 64 KiB."""
    return torch.tanh(torch.randn(64, 256) @ WEIGHT)


for _ in range(20):
    step()


@pytest.mark.parametrize("kind", ["warmup", "clean", "kept", "held"])
def test_loop(kind: str, request: pytest.FixtureRequest) -> None:
    recorder = request.getfixturevalue("memtrace") if TOOL == "leakgate" else None
    held = []
    with recorder.phase("loop") if recorder else nullcontext():
        for batch in range(BATCHES):
            out = step()
            if kind == "kept":
                KEPT.append(out)
            elif kind == "held":
                held.append(out)
            if recorder:
                recorder.checkpoint("BATCH", batch=batch)

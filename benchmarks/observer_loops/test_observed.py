"""A validation loop of ``BATCHES`` batches under a user's own tool, as a pytest test, with or
without leakgate's ``memleak`` marker (``OBSERVED_PLUGIN=1``; ``bench_search.py`` runs the marked
test with and without ``--memreport-explain``).

Tools (``OBSERVED_TOOL``): ``profiler`` leaves ``torch.profiler.profile(activities=[CPU],
record_shapes=True, profile_memory=True, with_stack=True)`` running through the loop (its events
pile up: the leak), ``tracer`` runs the loop under a ``sys.settrace`` function that follows every
line, as a coverage tool does, and keeps the lines of a batch's tensor (a leak too), ``none``
runs it plain with the tracer's leak.
"""

from __future__ import annotations

import os
import sys
from contextlib import nullcontext

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

BATCHES = int(os.environ.get("OBSERVED_BATCHES", "300"))
TOOL = os.environ.get("OBSERVED_TOOL", "profiler")
PLUGIN = os.environ.get("OBSERVED_PLUGIN") == "1"
LINES: list[int] = []
torch.manual_seed(0)
torch.set_num_threads(1)
if PLUGIN:
    pytestmark = pytest.mark.memleak(phase="validation", max_growth="4MB", warmup=5)


def tracer(frame, event, arg):  # type: ignore[no-untyped-def]
    if event == "line":
        LINES.append(frame.f_lineno)
    return tracer


def test_observed(request: pytest.FixtureRequest) -> None:
    recorder = request.getfixturevalue("memtrace") if PLUGIN else None
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    kept = []
    prof = None
    if TOOL == "profiler":
        prof = profile(
            activities=[ProfilerActivity.CPU],
            record_shapes=True,
            profile_memory=True,
            with_stack=True,
        )
        prof.start()
    elif TOOL == "tracer":
        sys.settrace(tracer)
    try:
        with recorder.phase("validation") if recorder else nullcontext(), torch.no_grad():
            for batch in range(BATCHES):
                out = model(torch.randn(32, 64))
                if TOOL != "profiler":
                    kept.append(out.repeat(64, 1))  # 64 KiB a batch
                if recorder:
                    recorder.checkpoint("VALIDATION_BATCH", batch=batch)
    finally:
        sys.settrace(None)
        if prof is not None:
            prof.stop()

"""Benchmarks run torch on one thread: batch-1 work gains nothing from intra-op threads, and a
second spinning thread would compete with the other process on a 2-core machine. Each benchmark
records the machine's 1-minute load average when it ends."""

import os
from collections.abc import Iterator

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _load_average(request: pytest.FixtureRequest) -> Iterator[None]:
    timed = request.getfixturevalue("benchmark") if "benchmark" in request.fixturenames else None
    yield
    if timed is not None:
        timed.extra_info["load_1min"] = os.getloadavg()[0]

"""The live heap is read from the allocator that serves ``malloc``: a preloaded jemalloc or
tcmalloc takes glibc's place, and ``mallinfo2`` then reads arenas nobody uses. Reported: with
either preloaded, a 10 MiB leak of tensors, bytes or numpy arrays passed."""

import json
import os

import pytest

from harness._measure import malloc
from harness._measure.probes import CpuProbe

LIBRARIES = "/usr/lib/x86_64-linux-gnu"
PRELOADED = {
    "jemalloc": f"{LIBRARIES}/libjemalloc.so.2",
    "tcmalloc": f"{LIBRARIES}/libtcmalloc_minimal.so.4",
}

CASES = """
import numpy as np
import pytest
import torch

MiB = 1 << 20
KEEPS = {
    "tensor": lambda: torch.ones(MiB // 64 // 4),
    "bytes": lambda: b"x" * (MiB // 64),
    "numpy": lambda: np.ones(MiB // 64 // 8),
}


@pytest.mark.memleak(phase="validation", max_growth="4MB", warmup=5)
@pytest.mark.parametrize("kind", [*KEEPS, None])
def test_loop(memtrace, kind):
    kept = []
    with memtrace.phase("validation", epoch=0):
        for i in range(704):
            item = KEEPS[kind or "tensor"]()
            if kind is not None:
                kept.append(item)  # 16 KiB a batch: 11 MiB in all
            memtrace.checkpoint("VALIDATION_BATCH", batch=i)
"""


@pytest.mark.skipif(malloc.heap().allocator != "glibc", reason="glibc's malloc serves here")
def test_glibc_is_found_where_it_serves_malloc():
    before = malloc.live_heap()
    kept = bytearray(8 << 20)
    assert malloc.live_heap() - before >= len(kept)


@pytest.mark.parametrize("allocator", sorted(PRELOADED))
def test_a_leak_fails_and_a_clean_loop_passes_under_a_preloaded_allocator(
    pytester, monkeypatch, allocator
):
    library = PRELOADED[allocator]
    if not os.path.exists(library):
        pytest.skip(f"{allocator} is not installed ({library})")
    monkeypatch.setenv("LD_PRELOAD", library)
    pytester.makepyfile(test_cases=CASES)
    pytester.runpytest_subprocess("-p", "no:randomly", "--memreport=out", "-p", "no:cacheprovider")
    statuses = {}
    for saved in (pytester.path / "out").glob("*.json"):
        verdict = json.loads(saved.read_text())
        statuses[verdict["test"].split("[")[-1].rstrip("]")] = verdict["status"]
        notes = " ".join(verdict["header"]["notes"])
        assert f"cpu allocated read from {allocator}'s own counter" in notes
    assert statuses == {"tensor": "FAIL", "bytes": "FAIL", "numpy": "FAIL", "None": "PASS"}


def test_an_allocator_whose_counters_cannot_be_read_is_judged_on_resident_memory(
    monkeypatch, fresh_allocator
):
    monkeypatch.setattr(malloc, "_serves", lambda read: False)
    monkeypatch.setattr(malloc, "_jemalloc", lambda: None)
    monkeypatch.setattr(malloc, "_tcmalloc", lambda: None)
    assert malloc.live_heap() is None
    probe = CpuProbe()
    assert probe.primary == "rss"
    assert any("malloc is not glibc's" in note for note in probe.notes)
    assert probe.sample()["allocated"] is None
    probe.close()

"""The floor a CPU checkpoint's cost is held against (``benchmarks/bench_checkpoint.py``'s raw
reads) is every read that checkpoint makes, each as often, and nothing else: each reader of the
probe is counted while a read checkpoint runs and while the raw reads run alone."""

from __future__ import annotations

import importlib.util
import os
import resource
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import Recorder
from harness._measure import host

ROOT = Path(__file__).resolve().parent.parent
SPEC = importlib.util.spec_from_file_location(
    "bench_checkpoint", ROOT / "benchmarks" / "bench_checkpoint.py"
)
assert SPEC is not None and SPEC.loader is not None
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Recorder, Counter[str]]]:
    """A CPU recorder whose probe's readers count their calls, by name (``/proc/self/status``
    left out: it is read only when the high-water mark is above ``rss``; a pool only where it
    is read, its library imported)."""
    calls: Counter[str] = Counter()

    def count(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def counting(*args: Any) -> Any:
            found = function(*args)
            calls[name] += found is not None or not name.startswith("pool ")
            return found

        return counting

    recorder = Recorder("cpu", children=False)
    probe = recorder.probe
    reader, python, heap = probe._host, probe._host._python, probe._host._heap
    if reader._held is None or python.read() is None:
        recorder.close()
        pytest.skip("malloc's holding or Python's allocator is not read here")
    for owner, name in (
        (reader, "_malloc"),
        (reader, "_held"),
        (python, "_stats"),
        (python, "_types"),
        (heap, "_sbrk"),
        (heap, "_mincore"),
    ):
        monkeypatch.setattr(owner, name, count(name, getattr(owner, name)))
    for name, pool in list(host.POOLS.items()):
        monkeypatch.setitem(host.POOLS, name, count(f"pool {name}", pool))
    monkeypatch.setattr(resource, "getrusage", count("getrusage", resource.getrusage))
    files = {reader._statm: "statm", probe._clear_refs: "clear_refs"}
    for name in ("pread", "write"):
        function = getattr(os, name)

        def by_file(fd: int, *rest: Any, _function: Callable[..., Any] = function) -> Any:
            if fd in files:
                calls[files[fd]] += 1
            return _function(fd, *rest)

        monkeypatch.setattr(os, name, by_file)
    try:
        yield recorder, calls
    finally:
        recorder.close()


def test_the_raw_reads_are_every_read_a_read_checkpoint_makes(counted):
    recorder, calls = counted
    raw = bench.raw_reads(recorder.probe)
    recorder.checkpoint("TRAIN_BATCH")
    calls.clear()
    recorder.checkpoint("TRAIN_BATCH")
    checkpoint = Counter(calls)
    calls.clear()
    raw()
    assert checkpoint["_mincore"] == checkpoint["_stats"] == 1
    assert calls == checkpoint


def test_a_loop_batch_between_two_stride_readings_reads_nothing(counted):
    recorder, calls = counted
    for batch in range(40):
        recorder.checkpoint("TRAIN_BATCH", batch=batch)
    calls.clear()
    recorder.checkpoint("TRAIN_BATCH", batch=40)
    assert calls == Counter()

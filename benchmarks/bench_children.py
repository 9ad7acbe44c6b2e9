"""Cost of reading the live descendants' memory (``harness._measure.children``) with 0, 2 and 4
DataLoader workers alive (forked, persistent, publishing their live heap, idle between
readings): the reading of every checkpoint (each worker's slot), the rollup reading of phase
edges (``smaps_rollup``), finding the children alone, and psutil's way of doing the same where
psutil is installed; and a CPU ``Recorder`` checkpoint with children recorded and without
(``children=False``), which ``reports/bench.md`` shows.

    pytest benchmarks/bench_children.py

Run as a script, it prints the median of each, in microseconds:

    python benchmarks/bench_children.py
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator

import pytest
import torch
from torch.utils.data import DataLoader

from harness._measure import heap_board
from harness._measure.children import ChildrenReader
from harness._measure.patches import PATCHES
from harness._measure.procfs import descendants
from harness._recorder import Recorder

WORKERS = (0, 2, 4)


def started_workers(count: int) -> Iterator[object] | None:
    """An iterator whose ``count`` forked workers stay alive while it does (``None`` for 0)."""
    if count == 0:
        return None
    PATCHES.hold(heap_board.WORKERS)  # as a recorder made before the loader: workers publish
    batches = iter(
        DataLoader(
            range(1 << 20),
            num_workers=count,
            persistent_workers=True,
            multiprocessing_context="fork",
        )
    )
    next(batches)
    return batches


def psutil_read() -> Callable[[], object] | None:
    """psutil's reading of the same tree: ``children(recursive=True)`` and each child's
    ``memory_full_info`` (USS, PSS); ``None`` without psutil."""
    try:
        import psutil
    except ImportError:
        return None
    me = psutil.Process()

    def read() -> object:
        return [child.memory_full_info() for child in me.children(recursive=True)]

    return read


def reads() -> dict[str, Callable[[], object]]:
    """Each way of reading this process's children, by name."""
    reader = ChildrenReader()
    pid = os.getpid()
    ways: dict[str, Callable[[], object]] = {
        "reading": reader.read,
        "rollup reading": lambda: reader.read(rollup=True),
        "listing": lambda: descendants(pid),
    }
    by_psutil = psutil_read()
    if by_psutil is not None:
        import psutil

        me = psutil.Process()
        ways["psutil reading"] = by_psutil
        ways["psutil listing"] = lambda: me.children(recursive=True)
    return ways


def median_us(read: Callable[[], object], rounds: int = 200) -> float:
    times = []
    clock = time.perf_counter
    for _ in range(rounds):
        started = clock()
        read()
        times.append(clock() - started)
    return statistics.median(times) * 1e6


@pytest.fixture(params=WORKERS, ids=lambda n: f"{n}-workers")
def workers(request) -> Iterator[int]:
    batches = started_workers(request.param)
    yield request.param
    del batches


@pytest.mark.parametrize("rollup", [False, True], ids=["statm", "rollup"])
def test_read_children(benchmark, workers, rollup):
    """One reading of every live descendant; each way's median (µs) goes to ``extra_info``."""
    reader = ChildrenReader()
    assert len(reader.read().processes) >= workers
    benchmark.pedantic(reader.read, kwargs={"rollup": rollup}, rounds=200, warmup_rounds=5)
    benchmark.extra_info["ways_us"] = {name: median_us(read) for name, read in reads().items()}


@pytest.mark.parametrize("children", [True, False], ids=["children", "no-children"])
def test_checkpoint_children(benchmark, workers, children):
    """A memory-only CPU checkpoint with ``workers`` live DataLoader workers."""
    with Recorder("cpu", children=children) as rec:
        benchmark.pedantic(rec.checkpoint, args=("BATCH",), rounds=400, warmup_rounds=8)
    benchmark.extra_info.update(workers=workers, children=children)


def checkpoint_us(children: bool, rounds: int = 400) -> float:
    """The mean time of a CPU checkpoint (children recorded or not), in microseconds."""
    with Recorder("cpu", children=children) as rec:
        started = time.perf_counter()
        for _ in range(rounds):
            rec.checkpoint("BATCH")
        return (time.perf_counter() - started) / rounds * 1e6


def main() -> None:
    torch.set_num_threads(1)
    print(f"{'workers':>7}  " + "  ".join(f"{name:>14}" for name in reads()))
    for count in WORKERS:
        batches = started_workers(count)
        costs = [median_us(read) for read in reads().values()]
        print(f"{count:>7}  " + "  ".join(f"{cost:>11.1f} µs" for cost in costs))
        on, off = checkpoint_us(True), checkpoint_us(False)
        print(f"{'':>7}  checkpoint (mean): {on:.1f} µs with children, {off:.1f} µs without")
        del batches


if __name__ == "__main__":
    main()

"""Cost of one checkpoint, per probe, with and without collection, with and without a timeline,
and of the system reads a CPU checkpoint is made of, alone (``test_raw_reads``).

    pytest benchmarks/bench_checkpoint.py

Run as a script, it prints the CPU noise floor instead: the spread of ``rss`` and
``allocated`` over 176 checkpoints after a warm-up, plain and collected, idle and with a small
training step between them.

    python benchmarks/bench_checkpoint.py
"""

from __future__ import annotations

import functools
import itertools
import os
import resource
import statistics
import time
from collections.abc import Callable

import pytest
import torch

from harness import Recorder
from harness._measure.host import POOLS
from harness._measure.probes import CpuProbe

PROBES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
        ],
    ),
]


@pytest.fixture(params=PROBES)
def probe(request) -> str:
    return request.param


@pytest.mark.parametrize("timeline", [False, True], ids=["memory", "timeline"])
def test_checkpoint(benchmark, probe, timeline, tmp_path):
    with Recorder(probe, timeline=tmp_path / "t.jsonl" if timeline else None) as rec:
        benchmark.pedantic(rec.checkpoint, ("TRAIN_BATCH",), rounds=20_000)


def test_checkpoint_between(benchmark, tmp_path):
    """A loop's batch checkpoint with a timeline, past a label's first batches: all but one in
    :data:`harness._measure.sample.STRIDE`'s ``every`` read no memory, so the median is one of
    those; the one read costs what ``test_checkpoint[cpu-timeline]`` does, and writes the others'
    lines."""
    batches = itertools.count()
    with Recorder("cpu", timeline=tmp_path / "t.jsonl") as rec:
        benchmark.pedantic(
            lambda: rec.checkpoint("TRAIN_BATCH", batch=next(batches)), rounds=20_000
        )


def probe_reads(probe: CpuProbe, places: bool = True) -> dict[str, Callable[[], object]]:
    """Exactly the reads a CPU checkpoint makes while ``rss`` is at its high-water mark (as on
    an idle heap), by name, through ``probe``'s own readers and file descriptors, and nothing
    else (no parsing, no sample): ``mallinfo2`` (the live heap, and what malloc holds from the
    same call), the walk of Python's allocator printed into a stream with the interpreter's
    free lists (the checkpoint parses that text: not a read), the library pools' counters, a
    ``pread`` of ``/proc/self/statm``, ``mincore`` over malloc's main heap (which of its pages
    are resident, for ``outside``), ``getrusage`` and ``5`` written to
    ``/proc/self/clear_refs`` (``/proc/self/status`` is read only when ``getrusage``'s mark is
    above ``rss``). Without ``places``, the reads of a checkpoint that reads ``malloc`` alone
    (no Python's allocator, no pools, and so no ``outside`` and no ``mincore``). A source the
    probe does without is left out, as the checkpoint leaves it out (and ``malloc_trim(0)``
    added where the probe trims before every reading)."""
    host = probe._host
    status, clear_refs = probe._status, probe._clear_refs
    statm = host._statm
    python = places and host._python.read() is not None
    reads: dict[str, Callable[[], object] | None] = {
        "malloc_trim": functools.partial(probe._malloc_trim, 0) if probe._trim_each else None,
        "mallinfo2": host._malloc,
        "mallinfo2 (held)": host._held,
        "Python's allocator (its walk, printed)": host._python._walk if python else None,
        **{f"pool {name}": pool for name, pool in POOLS.items() if places and pool() is not None},
        "statm": None if statm is None else functools.partial(os.pread, statm, 128, 0),
        "mincore (malloc's main heap)": host._heap.absent
        if python and statm is not None and host._held is not None
        else None,
        "getrusage": None
        if status is None
        else functools.partial(resource.getrusage, resource.RUSAGE_SELF),
        "clear_refs": None if clear_refs is None else functools.partial(os.write, clear_refs, b"5"),
    }
    return {name: read for name, read in reads.items() if read is not None}


def raw_reads(probe: CpuProbe, places: bool = True) -> Callable[[], None]:
    """All of :func:`probe_reads` in one call."""
    reads = tuple(probe_reads(probe, places).values())
    if not reads:
        pytest.skip("the CPU probe reads nothing here")

    def read_all() -> None:
        for read in reads:
            read()

    return read_all


def test_raw_reads(benchmark):
    """The floor under ``test_checkpoint[cpu-memory]``: its system reads alone; each read's
    own median goes to ``extra_info`` (seconds), to say which one dominates."""
    probe = CpuProbe()
    try:
        benchmark.pedantic(raw_reads(probe), rounds=20_000)
        benchmark.extra_info["reads"] = read_costs(probe)
    finally:
        probe.close()


def read_costs(probe: CpuProbe, rounds: int = 20_000) -> dict[str, float]:
    """Median seconds of each of :func:`probe_reads`, timed alone."""
    costs = {}
    clock = time.perf_counter
    for name, read in probe_reads(probe).items():
        times = []
        for _ in range(rounds):
            started = clock()
            read()
            times.append(clock() - started)
        costs[name] = statistics.median(times)
    return costs


def test_checkpoint_collect(benchmark, probe, tmp_path):
    """A full ``gc.collect()`` plus the probe's release; torch's objects are frozen by then."""
    with Recorder(probe, timeline=tmp_path / "t.jsonl") as rec:
        benchmark.pedantic(
            rec.checkpoint,
            ("EPOCH_END",),
            {"collect": True},
            rounds=500,
            warmup_rounds=5,
        )


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    loss = model(torch.randn(32, 256)).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def noise_floor(checkpoints: int = 176, warmup: int = 20) -> list[dict[str, object]]:
    """The spread of the CPU metrics over checkpoints after a warm-up: idle, and with a small
    training step (a 256x256 linear layer, Adam) between checkpoints; one row per case and
    metric, in bytes. The checkpoints carry no batch number, so each reads memory (a loop's
    batches are read on a stride)."""
    model = torch.nn.Linear(256, 256)
    optimizer = torch.optim.Adam(model.parameters())
    rows = []
    for work in (False, True):
        for collect in (False, True):
            with Recorder("cpu") as rec:
                for _ in range(warmup + checkpoints):
                    if work:
                        train_step(model, optimizer)
                    rec.checkpoint("batch", collect=collect)
                samples = rec.samples[warmup:]
            for metric in ("rss", "allocated"):
                values = [s.get(metric) for s in samples]
                steps = [b - a for a, b in itertools.pairwise(values)]
                rows.append(
                    {
                        "between": "train step" if work else "idle",
                        "collect": collect,
                        "metric": metric,
                        "range": max(values) - min(values),
                        "end_minus_start": values[-1] - values[0],
                        "step_stdev": statistics.pstdev(steps),
                    }
                )
    return rows


if __name__ == "__main__":
    from report import noise_table

    torch.set_num_threads(1)
    print(noise_table(noise_floor()))

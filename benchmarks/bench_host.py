"""What reading every place host memory lives costs: each read alone (``malloc``'s live heap and
holding, the walk of Python's allocator, pyarrow's pool, ``statm``), a checkpoint that reads
them against the same checkpoint reading ``malloc`` alone, and the checkpoints' own time in one
TFT epoch at the incident's size (704 training and 176 validation windows, batch 1, CPU).

A checkpoint that reads ``malloc`` alone is the probe with the others taken out of its host
reader (Python's allocator answering nothing, no pool), so both ways are measured in one
process, alternating.

    python benchmarks/bench_host.py [--reps N] [--write]
"""

from __future__ import annotations

import itertools
import os
import statistics
import time
from collections.abc import Callable

import pyarrow  # noqa: F401  (its pool is read once imported)
import torch
from common import incident_config, incident_split, section_arguments, show_section

from harness import Recorder
from harness._measure.host import POOLS, HostMemory
from harness._measure.python_heap import PythonHeap
from tft.model import TemporalFusionTransformer
from tft.trainer import TrainConfig, Trainer

HEADING = "## Every place host memory lives: the cost of reading it"
ROUNDS = 2_000


def median_us(read: Callable[[], object], rounds: int = ROUNDS) -> float:
    """Median µs of ``read`` timed alone."""
    clock, times = time.perf_counter, []
    for _ in range(rounds):
        started = clock()
        read()
        times.append(clock() - started)
    return statistics.median(times) * 1e6


def reads() -> dict[str, float]:
    """Each read's median µs."""
    host, python = HostMemory(), PythonHeap()
    statm = os.open("/proc/self/statm", os.O_RDONLY)
    found: dict[str, Callable[[], object]] = {
        "malloc's live heap (mallinfo2)": host._malloc,
        "malloc's holding (mallinfo2)": host._held,
        "Python's allocator (its walk)": python.read,
        **{f"{name}'s pool": pool for name, pool in POOLS.items()},
        "statm (rss, anon)": lambda: os.pread(statm, 128, 0),
        "the host reading in all": lambda: host.read({}),
    }
    costs = {name: median_us(read) for name, read in found.items() if read is not None}
    os.close(statm)
    arenas = python.read()
    costs["(Python's arenas, MiB)"] = (arenas.arenas if arenas else 0) / 2**20
    return costs


class _MallocOnly(PythonHeap):
    """Python's allocator, unread: what a checkpoint costs without its walk."""

    def read(self):  # type: ignore[no-untyped-def]
        return None


def checkpoints(reps: int) -> dict[str, float]:
    """Median µs of a read checkpoint (a phase's edge: every metric read), the whole-job way
    and reading ``malloc`` alone, alternating in one process."""
    found: dict[str, list[float]] = {"whole job": [], "malloc alone": []}
    for _, way in itertools.product(range(reps), found):
        saved = dict(POOLS)
        with Recorder("cpu", children=False) as rec:
            if way == "malloc alone":
                rec.probe._host._python = _MallocOnly()
                POOLS.clear()
            try:
                found[way].append(median_us(lambda: rec.checkpoint("EPOCH_END"), 500))
            finally:
                POOLS.update(saved)
    return {way: statistics.median(times) for way, times in found.items()}


def epoch_share() -> tuple[float, float, int]:
    """One TFT epoch recorded: the checkpoints' own seconds, the epoch's, and their number."""
    torch.manual_seed(0)
    split = incident_split()
    spent: list[float] = []
    recorder = Recorder("cpu")
    clock = time.perf_counter

    def timed(label: str, **where: object) -> object:
        started = clock()
        try:
            return recorder(label, **where)
        finally:
            spent.append(clock() - started)

    config = TrainConfig(epochs=1, batch_size=1)
    trainer = Trainer(TemporalFusionTransformer(incident_config(split)), config, callbacks=[timed])
    started = clock()
    trainer.fit(split.train, split.val)
    epoch = clock() - started
    recorder.close()
    return sum(spent), epoch, len(spent)


def main() -> None:
    args = section_arguments(__doc__ or "").parse_args()
    torch.set_num_threads(1)
    costs = reads()
    ways = checkpoints(args.reps)
    own, epoch, count = epoch_share()
    arenas = costs.pop("(Python's arenas, MiB)")
    share = 100 * own / epoch
    rows = "\n".join(f"| {name} | {us:.1f} |" for name, us in costs.items())
    text = f"""{HEADING}

Each read timed alone (median of {ROUNDS:,} calls, torch and pyarrow imported, {arenas:.0f} MiB of
Python's arenas); a read checkpoint (a phase's edge, every metric read) the whole-job way and
reading `malloc` alone, alternating in one process ({args.reps} repetitions of 500, medians);
and one TFT epoch at the incident's size recorded by `Recorder("cpu")`, each of its
checkpoints timed (`python benchmarks/bench_host.py --reps {args.reps}`).

| read | median µs |
|---|---|
{rows}

| checkpoint | median µs |
|---|---|
| reading every place (malloc, Python's allocator, pools, statm) | {ways["whole job"]:.1f} |
| reading malloc alone (and statm) | {ways["malloc alone"]:.1f} |

One TFT epoch: {count} checkpoints took {own * 1e3:.0f} ms of {epoch:.1f} s, **{share:.2f}%** of the
epoch (goal: at most 1%)."""
    show_section(HEADING, text, args.write)


if __name__ == "__main__":
    main()

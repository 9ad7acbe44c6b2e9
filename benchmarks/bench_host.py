"""What reading every place host memory lives costs, and what a checkpoint adds to its reads.

- Each read alone: ``malloc``'s live heap and holding (one ``mallinfo2``), the walk of Python's
  allocator printed into a stream with the interpreter's free lists, that text parsed, pyarrow's
  pool, ``statm`` and ``mincore`` over malloc's main heap.
- A read checkpoint against its raw reads (``bench_checkpoint.probe_reads``: each read it makes,
  once, through the probe's own readers), both ways: every place read, and ``malloc`` alone (the
  probe's Python allocator answering nothing and no pool, so no ``outside`` and no ``mincore``);
  and a loop's batches past the stride's first readings (one read in 16, medians of each kind),
  against the raw reads' share of a batch. The ways alternate in one process.
- One TFT epoch at the incident's size (704 training and 176 validation windows, batch 1, CPU)
  recorded by ``Recorder("cpu")``: the checkpoints' own time, wall and CPU, against the epoch's;
  then one more epoch with the reads timed, for where a reading's time goes in training.

    python benchmarks/bench_host.py [--reps N] [--write]
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow  # noqa: F401  (its pool is read once imported)
import torch
from bench_checkpoint import raw_reads
from common import (
    ROOT,
    alternating,
    incident_config,
    incident_split,
    section_arguments,
    show_section,
)

from harness import Recorder
from harness._measure.host import POOLS, HostMemory
from harness._measure.probes import CpuProbe
from harness._measure.python_heap import PythonHeap
from harness._measure.sample import STRIDE
from tft.model import TemporalFusionTransformer
from tft.trainer import TrainConfig, Trainer

HEADING = "## Every place host memory lives: the cost of reading it"
ROUNDS = 2_000
WAYS = ("every place", "malloc alone")
GOAL_RATIO, GOAL_SHARE = 1.5, 1.0
WALK, PARSED = "Python's allocator: its walk, printed", "Python's allocator: that text parsed"


def median_us(read: Callable[[], object], rounds: int = ROUNDS) -> float:
    """Median µs of ``read`` timed alone."""
    clock, times = time.perf_counter, []
    for _ in range(rounds):
        started = clock()
        read()
        times.append(clock() - started)
    return statistics.median(times) * 1e6


def reads() -> tuple[dict[str, float], dict[str, float]]:
    """Each read's median µs, and the sizes it reads over (MiB)."""
    host = HostMemory()
    python = host._python
    walked = python._walk()
    statm = os.open("/proc/self/statm", os.O_RDONLY)
    found: dict[str, Callable[[], object] | None] = {
        "malloc's live heap and holding (mallinfo2)": host._malloc,
        WALK: python._walk,
        PARSED: None if walked is None else python.read,
        **{f"{name}'s pool": pool for name, pool in POOLS.items()},
        "statm (rss, anon)": lambda: os.pread(statm, 128, 0),
        "mincore over malloc's main heap": host._heap.absent,
        "the host reading in all": lambda: host.read({}),
    }
    costs = {name: median_us(read) for name, read in found.items() if read is not None}
    if walked is not None:  # the parse is the read less its walk
        costs[PARSED] -= costs[WALK]
    os.close(statm)
    arenas = python.read()
    heap = host._heap
    sizes = {
        "arenas": (arenas.arenas if arenas else 0) / 2**20,
        "heap": ((heap._sbrk(0) or 0) - (heap._start or 0)) / 2**20,
    }
    host.close()
    return costs, sizes


class _MallocOnly(PythonHeap):
    """Python's allocator, unread: a checkpoint that reads ``malloc`` alone."""

    def read(self):  # type: ignore[no-untyped-def]
        return None


@contextmanager
def way(recorder: Recorder, name: str) -> Iterator[None]:
    """``recorder``'s probe reading every place, or ``malloc`` alone (no Python allocator, no
    pool) while the block runs."""
    saved = dict(POOLS)
    if name == "malloc alone":
        recorder.probe._host._python = _MallocOnly()
        POOLS.clear()
    try:
        yield
    finally:
        POOLS.update(saved)


def loop_batch_us(recorder: Recorder, batches: int) -> tuple[float, float]:
    """A loop's batch checkpoints past the stride's first readings, over ``batches`` of them
    (whole strides: one read in each): the median µs of the ones read and of the others
    (medians: another process taking the CPU mid-call adds to a mean)."""
    clock, read, unread = time.perf_counter, [], []
    for batch in range(STRIDE.first + batches):
        started = clock()
        sample = recorder.checkpoint("LOOP_BATCH", batch=batch)
        if batch >= STRIDE.first:
            (read if sample.get("allocated") is not None else unread).append(clock() - started)
    return statistics.median(read) * 1e6, statistics.median(unread) * 1e6


def checkpoints(reps: int) -> dict[str, dict[str, float]]:
    """Each way's medians over ``reps`` alternating repetitions: a read checkpoint, its raw
    reads, a loop's batch and the raw reads' share of a batch."""
    found: dict[str, dict[str, list[float]]] = {w: defaultdict(list) for w in WAYS}
    for _, name in alternating(WAYS, reps):
        with Recorder("cpu") as recorder, way(recorder, name):
            probe = recorder.probe
            assert isinstance(probe, CpuProbe)
            read = raw_reads(probe, places=name == "every place")
            times = found[name]
            times["checkpoint"].append(median_us(lambda: recorder.checkpoint("TRAIN_BATCH"), 500))
            times["raw"].append(median_us(read, 500))
            loop_read, loop_unread = loop_batch_us(recorder, 30 * STRIDE.every)
            times["loop read"].append(loop_read)
            times["unread"].append(loop_unread)
    result = {}
    every = STRIDE.every
    for name, times in found.items():
        row = {key: statistics.median(values) for key, values in times.items()}
        row["loop"] = (row["loop read"] + (every - 1) * row["unread"]) / every
        row["raw per batch"] = row["raw"] / every
        result[name] = row
    return result


PARTS = {
    WALK: ("_python", "_walk"),
    "Python's allocator: read in all": ("_python", "read"),
    "mincore over malloc's main heap": ("_heap", "absent"),
    "mallinfo2": (None, "_malloc"),
}
"""The reads timed inside a training epoch, by the host reader's attribute that makes each."""


def _timed(function: Callable[..., Any], into: list[float]) -> Callable[..., Any]:
    clock = time.thread_time

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = clock()
        try:
            return function(*args, **kwargs)
        finally:
            into.append(clock() - started)

    return timed


def epoch(parts: bool) -> dict[str, Any]:
    """One TFT epoch recorded: its seconds and the checkpoints', wall and CPU, split into the
    checkpoints that read and those that did not; with ``parts``, each of :data:`PARTS`' and the
    peak's reads timed too, in CPU time (their own time, in the checkpoints')."""
    torch.manual_seed(0)
    split = incident_split()
    recorder = Recorder("cpu")
    spent: dict[str, list[float]] = defaultdict(list)
    if parts:
        probe, host = recorder.probe, recorder.probe._host
        for name, (owner, attribute) in PARTS.items():
            target = host if owner is None else getattr(host, owner)
            setattr(target, attribute, _timed(getattr(target, attribute), spent[name]))
        for name, attribute in (("getrusage", "_peak"), ("clear_refs", "reset_peak")):
            setattr(probe, attribute, _timed(getattr(probe, attribute), spent[name]))
    clock, cpu = time.perf_counter, time.thread_time

    def timed(label: str, **where: object) -> object:
        started, started_cpu = clock(), cpu()
        sample = recorder(label, **where)
        kind = "read" if sample.get("allocated") is not None else "unread"
        spent[kind].append(clock() - started)
        spent[kind + " cpu"].append(cpu() - started_cpu)
        return sample

    config = TrainConfig(epochs=1, batch_size=1)
    trainer = Trainer(TemporalFusionTransformer(incident_config(split)), config, callbacks=[timed])
    started, started_cpu = clock(), cpu()
    trainer.fit(split.train, split.val)
    seconds, cpu_seconds = clock() - started, cpu() - started_cpu
    recorder.close()
    return {"seconds": seconds, "cpu": cpu_seconds, "spent": spent}


def epoch_shares(reps: int) -> dict[str, Any]:
    """The median over ``reps`` epochs of the checkpoints' share, wall and CPU, with the run
    nearest that median's counts; then one epoch with its parts timed."""
    runs = []
    for _ in range(reps):
        run = epoch(parts=False)
        spent = run["spent"]
        run["wall %"] = 100 * (sum(spent["read"]) + sum(spent["unread"])) / run["seconds"]
        run["cpu %"] = 100 * (sum(spent["read cpu"]) + sum(spent["unread cpu"])) / run["cpu"]
        runs.append(run)
    middle = sorted(runs, key=lambda r: r["cpu %"])[len(runs) // 2]
    return {
        "wall %": statistics.median(r["wall %"] for r in runs),
        "cpu %": statistics.median(r["cpu %"] for r in runs),
        "wall % each": [r["wall %"] for r in runs],
        "cpu % each": [r["cpu %"] for r in runs],
        "middle": middle,
        "parts": epoch(parts=True),
    }


def _us(values: list[float], count: int) -> str:
    return f"{sum(values) / count * 1e6:.0f}" if count else "-"


TIMED = (*PARTS, "getrusage", "clear_refs")
"""The parts of a read checkpoint timed inside the epoch (:data:`PARTS` and the peak's reads)."""


def epoch_text(shares: dict[str, Any], reps: int) -> str:
    """The epoch's paragraph and the table of where a reading's time goes."""
    middle, parts = shares["middle"], shares["parts"]
    spent, timed = middle["spent"], parts["spent"]
    read, unread = len(spent["read"]), len(spent["unread"])
    own_ms = (sum(spent["read"]) + sum(spent["unread"])) * 1e3
    own_cpu_ms = (sum(spent["read cpu"]) + sum(spent["unread cpu"])) * 1e3
    share = shares["cpu %"]
    status = met(share <= GOAL_SHARE)
    pairs = zip(shares["wall % each"], shares["cpu % each"], strict=True)
    each = ", ".join(f"{wall:.2f}/{cpu:.2f}%" for wall, cpu in pairs)
    count = len(timed["read"])
    rows = [f"| {name} | {_us(timed[name], count)} |" for name in TIMED]
    walk = sum(timed[WALK])
    rest = sum(timed["read cpu"]) - (sum(sum(timed[name]) for name in TIMED) - walk)
    rest_row = (
        "| the rest: statm, the pool, the children's look, the sample, the store and the "
        f"recorder's Python | {rest / count * 1e6:.0f} |"
    )
    return "\n".join(
        [
            f'One TFT epoch at the incident\'s size recorded by `Recorder("cpu")`, each checkpoint '
            f"timed, {reps} epochs: {read + unread} checkpoints ({read} read, {unread} between two "
            f"stride readings) took {own_ms:.0f} ms of {middle['seconds']:.1f} s, and "
            f"{own_cpu_ms:.0f} ms of {middle['cpu']:.1f} s of CPU time (the median epoch): "
            f"**{shares['wall %']:.2f}%** of the epoch's wall time and **{share:.2f}%** of its "
            f"CPU time (each epoch, wall/CPU: {each}; goal: at most {GOAL_SHARE:.0f}%, judged on "
            f"CPU time, which other work on the machine does not add to: {status}). A read "
            f"checkpoint took {_us(spent['read cpu'], read)} µs of CPU time on average, one "
            f"between two readings {_us(spent['unread cpu'], unread)} µs.",
            "",
            "Where a reading's time goes inside the epoch: one more epoch with each read timed "
            f"(mean µs of CPU time per read checkpoint, {count} of them; in all is the walk with "
            "its text parsed):",
            "",
            "| part of a read checkpoint | mean µs |",
            "|---|---:|",
            *rows,
            rest_row,
            f"| a read checkpoint | {_us(timed['read cpu'], count)} |",
        ]
    )


def render(
    costs: dict[str, float],
    sizes: dict[str, float],
    ways: dict[str, dict[str, float]],
    shares: dict[str, Any],
    reps: int,
    loads: tuple[float, float],
) -> str:
    """The section: the reads alone, the checkpoint against its raw reads, the epoch."""
    rows = [f"| {name} | {us:.1f} |" for name, us in costs.items()]
    way_rows = [
        f"| {name} | {row['checkpoint']:.1f} | {row['raw']:.1f} | "
        f"{row['checkpoint'] / row['raw']:.2f}x | {row['loop']:.1f} | "
        f"{row['raw per batch']:.1f} | {row['loop'] / row['raw per batch']:.2f}x |"
        for name, row in ways.items()
    ]
    read, loop_ratio = ratios(ways)
    machine = f"{platform.machine()}, {os.cpu_count()} cores"
    loop = 30 * STRIDE.every
    return "\n".join(
        [
            HEADING,
            "",
            f"Measured by `python benchmarks/bench_host.py --reps {reps} --write` on a shared "
            f"machine ({machine}; other work ran beside it: load average {loads[0]:.2f} at the "
            f"start, {loads[1]:.2f} at the end); ways alternating in one process, medians over "
            "the repetitions.",
            "",
            f"Each read timed alone (median of {ROUNDS:,} calls, torch and pyarrow imported, "
            f"{sizes['arenas']:.0f} MiB of Python's arenas, {sizes['heap']:.0f} MiB of malloc's "
            "main heap). The walk of Python's allocator prints its table and the interpreter's "
            "free lists into one in-memory stream; the parse takes the free lists' objects out "
            "of its blocks.",
            "",
            "| read | median µs |",
            "|---|---:|",
            *rows,
            "",
            'A read checkpoint (`checkpoint("TRAIN_BATCH")`, idle heap, children looked for) '
            "against its raw reads: the reads it makes, each once, through the probe's own "
            "readers and nothing else (`bench_checkpoint.probe_reads`), both ways: every place "
            "read (`mallinfo2`, the walk of Python's allocator, the pools, `statm`, `mincore`, "
            "`getrusage`, `clear_refs`), and `malloc` alone (no Python allocator, no pool: no "
            f"`outside`, so no `mincore`). A loop's batches: {loop} batch checkpoints past the "
            f"stride's first {STRIDE.first}: one read in {STRIDE.every}, the median of each kind "
            "weighed as the stride reads them, against the raw reads' share of a batch. "
            f"{reps} repetitions of 500 calls each. Section 1's table was measured before a "
            "checkpoint read Python's allocator and the pools.",
            "",
            "| reads | read checkpoint µs | its raw reads µs | ratio | a loop's batch µs "
            "| raw reads per batch µs | ratio |",
            "|---|---:|---:|---:|---:|---:|---:|",
            *way_rows,
            "",
            f"Every place read, a read checkpoint against its raw reads: **{read:.2f}x**; a "
            f"loop's batch against the raw reads' share of it: **{loop_ratio:.2f}x** (goal: at "
            f"most {GOAL_RATIO}x: {met(read <= GOAL_RATIO)}, {met(loop_ratio <= GOAL_RATIO)}). "
            "Reading `malloc` alone the reads are a few µs, and the checkpoint's own Python "
            "(the checks, the sample, the store's row, the children's look) is most of it.",
            "",
            epoch_text(shares, reps),
        ]
    )


def ratios(ways: dict[str, dict[str, float]]) -> tuple[float, float]:
    """Every place read, a read checkpoint's ratio to its raw reads and a loop's batch's to
    theirs."""
    every = ways["every place"]
    return every["checkpoint"] / every["raw"], every["loop"] / every["raw per batch"]


def met(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


GOAL_ROWS = (
    "| CPU checkpoint vs its raw reads",
    "| a loop's batch checkpoint vs its raw reads",
    "| a TFT epoch's checkpoints, every place read",
)
"""How this benchmark's rows of the goals table begin (the first was section 1's)."""
MISS_NOTES = ("- **Checkpoint vs raw reads", "- **A loop's batch", "- **A TFT epoch's checkpoints")
"""How this benchmark's notes under the missed goals begin (the first was section 1's)."""


def goals(ways: dict[str, dict[str, float]], shares: dict[str, Any]) -> tuple[list[str], list[str]]:
    """This benchmark's rows of the goals table, and the notes of those it missed."""
    every, alone = ways["every place"], ways["malloc alone"]
    read, loop = ratios(ways)
    share, wall = shares["cpu %"], shares["wall %"]
    rows = [
        "| CPU checkpoint vs its raw reads, every place read (Python's allocator, the pools, "
        f"`mincore`), idle heap (host reads) | {read:.2f}x ({every['checkpoint']:.1f} µs vs "
        f"{every['raw']:.1f} µs); reading malloc alone {alone['checkpoint'] / alone['raw']:.2f}x "
        f"| <= {GOAL_RATIO}x | {met(read <= GOAL_RATIO)} |",
        f"| a loop's batch checkpoint vs its raw reads, one read in {STRIDE.every}, every place "
        f"read (host reads) | {loop:.2f}x ({every['loop']:.1f} µs vs "
        f"{every['raw per batch']:.1f} µs) | <= {GOAL_RATIO}x | {met(loop <= GOAL_RATIO)} |",
        "| a TFT epoch's checkpoints, every place read (host reads) | "
        f"{share:.2f}% of its CPU time ({wall:.2f}% of its wall time) | <= {GOAL_SHARE:.0f}% | "
        f"{met(share <= GOAL_SHARE)} |",
    ]
    notes = []
    if max(read, loop) > GOAL_RATIO:
        notes.append(
            f"- **A loop's batch vs raw reads** ({loop:.2f}x; a read checkpoint {read:.2f}x). A "
            f"read checkpoint costs {every['checkpoint']:.1f} µs against its reads' "
            f"{every['raw']:.1f} µs: the walk's text parsed, the sample, the store's row and "
            f"the children's look. In a loop one batch in {STRIDE.every} is read "
            f"({every['loop read']:.1f} µs: the rows of the batches before it go into the store "
            "then, and its reads run on caches those batches left cooler) and each of the "
            f"others costs {every['unread']:.1f} µs, reading nothing: a batch "
            f"{every['loop']:.1f} µs against {every['raw per batch']:.1f} µs of reads. Reading "
            "`malloc` alone, its "
            f"{alone['raw']:.1f} µs of reads are {alone['raw'] / alone['checkpoint']:.0%} of the "
            f"checkpoint's {alone['checkpoint']:.1f} µs. Taken out: the walk's two prints into "
            "one stream, its text parsed by compiled patterns (the free lists' sizes read "
            "once), the stride's count inline."
        )
    if share > GOAL_SHARE:
        parts, middle = shares["parts"]["spent"], shares["middle"]
        count = len(parts["read"])
        dear = ("Python's allocator: read in all", "mincore over malloc's main heap", "mallinfo2")
        split = ", ".join(f"{name} {_us(parts[name], count)} µs" for name in dear)
        floor = sum(sum(parts[name]) for name in dear) / shares["parts"]["cpu"] * 100
        between = len(middle["spent"]["unread"])
        notes.append(
            f"- **A TFT epoch's checkpoints, every place read** ({share:.2f}% of its CPU time). "
            f"A read checkpoint takes {_us(parts['read cpu'], count)} µs inside training, most "
            f"of it walking memory that training left cold: {split} (host reads). These three "
            f"reads alone, exact at each of the stride's {count} readings, are {floor:.2f}% of "
            f"that epoch's CPU time; the {between} batches between two readings take "
            f"{_us(middle['spent']['unread cpu'], between)} µs each. Taken "
            "out: the walk's two prints into one stream, its text parsed by compiled patterns, "
            "the `mincore` vector kept and counted by numpy, the stride's count inline. Left: "
            "the reads are exact at every reading; fewer readings (the stride's first "
            f"{STRIDE.first} batches of each loop are all read: {2 * STRIDE.first} of these "
            f"{count}) or reads that are not exact would be needed."
        )
    return rows, notes


def show_goals(rows: list[str], notes: list[str]) -> None:
    """Put ``rows`` in ``reports/bench.md``'s goals table in place of the rows that begin as
    :data:`GOAL_ROWS` do (a new one after the row before it, or last), and ``notes``
    first under the missed goals in place of :data:`MISS_NOTES`' (a goal met has none)."""
    bench = ROOT / "reports" / "bench.md"
    lines = bench.read_text().split("\n")
    placed = None  # the line of the last row put in place
    for row, start in zip(rows, GOAL_ROWS, strict=True):
        at = next((i for i, line in enumerate(lines) if line.startswith(start)), None)
        if at is not None:
            lines[at] = row
        else:
            table = lines.index("## Goals") + 2
            end = next(i for i in range(table, len(lines)) if not lines[i].startswith("|"))
            at = end if placed is None else placed + 1
            lines.insert(at, row)
        placed = at
    lines = [line for line in lines if not line.startswith(MISS_NOTES)]
    heading = lines.index("## Missed goals: what dominates")
    lines[heading + 2 : heading + 2] = notes
    temporary = bench.with_name(f".{bench.name}.tmp")
    temporary.write_text("\n".join(lines))
    os.replace(temporary, bench)


def main() -> None:
    args = section_arguments(__doc__ or "").parse_args()
    torch.set_num_threads(1)
    before = os.getloadavg()[0]
    costs, sizes = reads()
    ways = checkpoints(args.reps)
    shares = epoch_shares(args.reps)
    text = render(costs, sizes, ways, shares, args.reps, (before, os.getloadavg()[0]))
    show_section(HEADING, text, args.write)
    rows, notes = goals(ways, shares)
    print("\n".join(rows + notes))
    if args.write:
        show_goals(rows, notes)
        print(f"wrote {ROOT / 'reports' / 'bench.md'}")


if __name__ == "__main__":
    main()

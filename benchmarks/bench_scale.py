"""Reading and judging long timelines: 10k, 100k and two 1M-checkpoint files.

A timeline of the trainer's shape (per epoch: 704 ``TRAIN_BATCH`` and 176 ``VALIDATION_BATCH``
with their phase events, three CPU metrics with a little noise) is written line by line as the
recorder writes it, from a seeded random generator (the same bytes on every run), then judged
in a child process each way, its wall time and peak resident memory (the child's ``VmHWM``)
kept. The second 1M file differs from the first only in its readings and start time, chosen
so that a line ends 16 bytes before a 2 MiB block boundary: the layout that sent a whole file
to the line-by-line reader before the columnar reader took every layout (issue 26: 38.7 s and
2.2 GB there, against 5.6 s and 342 MiB on the other).

- ``report``: ``python -m harness report TIMELINE`` as a user runs it (read, judge, render the
  markdown report and the JSON verdict);
- ``judge``: ``read_timeline`` then the statistics pass and every rule
  (``harness.judge``), the part this package's store and context serve;
- ``columns``: ``read_timeline`` then ``Context`` alone: the statistics pass over columns.

``judge`` and ``columns`` also print which reader read the file (``Timeline.reader``).

The store's bytes per checkpoint (``SampleStore.nbytes() / len``) are kept for each size read
in columns (files under ``harness.timeline_columns.COLUMNS_FROM``, 4 MiB, are read line by
line).

    pytest benchmarks/bench_scale.py
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from common import ROOT

from harness.timeline_columns import SCAN_BLOCK

FILES = ((10_000, None), (100_000, None), (1_000_000, None), (1_000_000, 2))
"""Each timeline judged: its checkpoints and the seed of :func:`write_timeline`."""
TRAIN, VALIDATION = 704, 176

STEPS = {
    "report": "import runpy; "
    "sys.argv = ['leakgate', 'report', sys.argv[1], '-o', sys.argv[1] + '.md']; "
    "runpy.run_module('harness', run_name='__main__')",
    "judge": "from harness.timeline import read_timeline; "
    "from harness.finish import rules_of; from harness import judge; "
    "t = read_timeline(sys.argv[1]); v = judge(t.samples, rules_of(t.header)); "
    "print(v.status, t.reader, "
    "getattr(t.samples, 'nbytes', lambda: float('nan'))() / len(t.samples))",
    "columns": "from harness.timeline import read_timeline; "
    "from harness.finish import rules_of; from harness.rules.context import Context; "
    "t = read_timeline(sys.argv[1]); c = Context(t.samples, rules_of(t.header)); "
    "print(len(c.groups), t.reader, "
    "getattr(t.samples, 'nbytes', lambda: float('nan'))() / len(t.samples))",
}
"""What the child runs for each step, on the timeline named by ``sys.argv[1]``."""


def child_code(step: str) -> str:
    """``step``'s code, then the child's own high-water mark of resident memory printed (in kB)
    however it ends: ``report`` ends by ``sys.exit``. (``ru_maxrss`` from ``wait4`` would
    also count the memory of the benchmark process that forked it, which the kernel keeps as a
    floor across ``exec``.)"""
    return (
        f"import re, sys\ntry:\n    {STEPS[step]}\nfinally:\n"
        "    print('VmHWM', re.search(r'VmHWM:\\s*(\\d+)', "
        "open('/proc/self/status').read()).group(1))"
    )


def write_timeline(path: Path, checkpoints: int, seed: int | None = None) -> int:
    """A timeline of about ``checkpoints`` samples; returns how many were written. ``seed``
    draws the readings (by default ``checkpoints``) and, when given, moves the start time by
    a seventh of that many seconds: the times' text lengths, and so where lines end, change
    with it (seed 2 at 1M puts a line end 16 bytes before a 2 MiB block boundary)."""
    rnd = random.Random(checkpoints if seed is None else seed)
    header = {
        "leakgate_timeline": 2,
        "probe": "cpu",
        "primary": "allocated",
        "metrics": ["allocated", "rss", "peak"],
        "rules": {"phase": ["training", "validation"], "max_growth": "256KB", "warmup": 5},
    }
    now, count = 1.7e9 + (seed or 0) / 7, 0
    with path.open("w") as out:
        out.write(json.dumps(header) + "\n")

        def line(label: str, phase: str, epoch: int | None, batch: int | None) -> None:
            nonlocal now, count
            now += 0.001
            count += 1
            allocated = 150_000_000 + rnd.randrange(20_000)
            rss = 400_000_000 + rnd.randrange(40_000)
            metrics = {"allocated": allocated, "rss": rss, "peak": rss + 4096}
            out.write(
                json.dumps(
                    {
                        "label": label,
                        "phase": phase,
                        "epoch": epoch,
                        "batch": batch,
                        "time": now,
                        "metrics": metrics,
                        "collected": batch is None and epoch is None,
                        "note": None,
                    },
                    separators=(",", ":"),
                )
                + "\n"
            )

        line("SESSION_START", "session", None, None)
        for epoch in range(max(1, (checkpoints - 2) // (TRAIN + VALIDATION + 4))):
            line("EPOCH_START", "training", epoch, None)
            for batch in range(TRAIN):
                line("TRAIN_BATCH", "training", epoch, batch)
            line("EPOCH_END", "training", epoch, None)
            line("VALIDATION_START", "validation", epoch, None)
            for batch in range(VALIDATION):
                line("VALIDATION_BATCH", "validation", epoch, batch)
            line("VALIDATION_END", "validation", epoch, None)
        line("SESSION_END", "session", None, None)
        out.write(json.dumps({"leakgate_end": {"error": None}}) + "\n")
    return count


def block_edges(path: Path) -> int:
    """How many lines end 16 bytes before a boundary of the columnar reader's scan blocks
    (:data:`~harness.timeline_columns.SCAN_BLOCK`, counted from the first sample line): where
    the reader used to find an "empty line" and hand the whole file to the line reader."""
    data = path.read_bytes()
    start = data.index(b"\n") + 1
    ends = range(start + SCAN_BLOCK - 16, len(data), SCAN_BLOCK)
    return sum(data[at] == ord("\n") for at in ends)


@pytest.fixture(scope="module")
def timelines(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple, tuple[Path, int, int]]:
    """Each of :data:`FILES` written: its path, checkpoints and :func:`block_edges`."""
    folder = tmp_path_factory.mktemp("scale")
    made = {}
    for size, seed in FILES:
        path = folder / f"t{size}-{seed}.jsonl"
        count = write_timeline(path, size, seed)
        made[size, seed] = (path, count, block_edges(path))
    return made


@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize(("size", "seed"), FILES)
def test_scale(benchmark, timelines, size, seed, step):
    path, count, edges = timelines[size, seed]
    result = benchmark.pedantic(_measured, (child_code(step), path), rounds=1)
    benchmark.extra_info.update(result, checkpoints=count, block_edges=edges)


def _measured(code: str, path: Path) -> dict[str, object]:
    """Seconds, peak resident bytes (the child's ``VmHWM``), exit code and last output line of
    one child process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryFile() as output:
        started = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-c", code, str(path)],
            cwd=ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        exit_code = child.wait()
        seconds = time.perf_counter() - started
        output.seek(0)
        lines = output.read().decode(errors="replace").strip().splitlines() or [""]
    peak = [int(line.split()[1]) * 1024 for line in lines if line.startswith("VmHWM ")]
    shown = [line for line in lines if not line.startswith("VmHWM ")] or [""]
    return {
        "seconds": seconds,
        "exit": exit_code,
        "peak_bytes": peak[-1] if peak else None,
        "last": shown[-1][:200],
    }

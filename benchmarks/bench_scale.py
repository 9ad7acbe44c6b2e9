"""Reading and judging long timelines: 10k, 100k and 1M checkpoints.

A timeline of the trainer's shape (per epoch: 704 ``TRAIN_BATCH`` and 176 ``VALIDATION_BATCH``
with their phase events, three CPU metrics with a little noise) is written line by line as the
recorder writes it, then judged in a child process each way, its wall time and peak resident
memory (``ru_maxrss`` of the child) kept:

- ``report``: what ``python -m harness report TIMELINE`` runs (read, judge, render the
  markdown report and the JSON verdict): what the issue measured (162 s and 2 GB at 1M);
- ``judge``: ``read_timeline`` then the statistics pass and every rule
  (``harness.judge``), the part this package's store and context serve;
- ``columns``: ``read_timeline`` then ``Context`` alone: the statistics pass over columns.

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

SIZES = (10_000, 100_000, 1_000_000)
TRAIN, VALIDATION = 704, 176

PEAK = (
    "\nimport re\nprint('VmHWM', re.search(r'VmHWM:\\s*(\\d+)', "
    "open('/proc/self/status').read()).group(1))"
)
"""Appended to each step: the child's own high-water mark of resident memory, in kB
(``ru_maxrss`` from ``wait4`` would also count the memory of the benchmark process that forked
it, which the kernel keeps as a floor across ``exec``)."""

STEPS = {
    "report": "import sys; from harness.cli import main; code = main(['report', sys.argv[1], "
    "'-o', sys.argv[1] + '.md']); print(code)",
    "judge": "import sys; from harness.timeline import read_timeline; "
    "from harness.finish import rules_of; from harness import judge; "
    "t = read_timeline(sys.argv[1]); v = judge(t.samples, rules_of(t.header)); "
    "print(v.status, getattr(t.samples, 'nbytes', lambda: float('nan'))() / len(t.samples))",
    "columns": "import sys; from harness.timeline import read_timeline; "
    "from harness.finish import rules_of; from harness.rules.context import Context; "
    "t = read_timeline(sys.argv[1]); c = Context(t.samples, rules_of(t.header)); "
    "print(len(c.groups), getattr(t.samples, 'nbytes', lambda: float('nan'))() / len(t.samples))",
}


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


@pytest.fixture(scope="module")
def timelines(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Path, int]]:
    folder = tmp_path_factory.mktemp("scale")
    made = {}
    for size in SIZES:
        path = folder / f"t{size}.jsonl"
        made[size] = (path, write_timeline(path, size))
    return made


@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize("size", SIZES)
def test_scale(benchmark, timelines, size, step):
    path, count = timelines[size]
    result = benchmark.pedantic(_measured, (STEPS[step] + PEAK, path), rounds=1)
    benchmark.extra_info.update(result, checkpoints=count)


def _measured(code: str, path: Path) -> dict[str, object]:
    """Seconds, peak resident bytes (the child's ``ru_maxrss``), exit code and last output
    line of one child process."""
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
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - started
        output.seek(0)
        lines = output.read().decode(errors="replace").strip().splitlines() or [""]
    del usage
    peak = [int(line.split()[1]) * 1024 for line in lines if line.startswith("VmHWM ")]
    shown = [line for line in lines if not line.startswith("VmHWM ")] or [""]
    return {
        "seconds": seconds,
        "exit": os.waitstatus_to_exitcode(status),
        "peak_bytes": peak[-1] if peak else None,
        "last": shown[-1][:200],
    }

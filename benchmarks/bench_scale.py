"""Reading and judging long timelines of two shapes: the trainer's and one long phase.

A timeline of the trainer's shape (per epoch: 704 ``TRAIN_BATCH`` and 176 ``VALIDATION_BATCH``
with their phase events) or of one phase (``VALIDATION_BATCH`` after ``VALIDATION_START``: a
long pre-training epoch with a checkpoint per step), three CPU metrics with a little noise, is
written line by line as the recorder writes it, from a seeded random generator (the same bytes
on every run), as rank 0 of a world of one, then judged in a child process each way, its wall
time and peak resident memory (the child's ``VmHWM``) kept. Each shape is written at 100k and
twice at 1M, with the default seed and seed 2, which differ in their readings and start time:
in the trainer's shape seed 2 puts a line end 16 bytes before a 2 MiB block boundary, the
layout that sent a whole file to the line-by-line reader before the columnar reader took every
layout (issue 26: 38.7 s and 2.2 GB there, against 5.6 s and 342 MiB on the other).

- ``report``: ``python -m harness report TIMELINE`` as a user runs it (read, judge, render the
  markdown report and the JSON verdict);
- ``gate``: ``python -m harness gate`` on the timeline's folder, which holds its merged verdict
  (made untimed first);
- ``merge``: ``python -m harness merge TIMELINE`` into a folder of its own (the rank judged,
  then the ranks compared, one report);
- ``judge``: ``read_timeline`` then the statistics pass and every rule (``harness.judge``),
  the part this package's store and context serve;
- ``columns``: ``read_timeline`` then ``Context`` alone: the statistics pass over columns.

``judge`` and ``columns`` also print which reader read the file (``Timeline.reader``). The
one-phase shape runs ``report``, ``gate`` and ``merge``; the trainer's runs ``report``,
``judge`` and ``columns``, and a 10k file too.

The store's bytes per checkpoint (``SampleStore.nbytes() / len``) are kept for each size read
in columns (files under ``harness._timeline.columns.COLUMNS_FROM``, 4 MiB, are read line by
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

from harness._timeline.columns import SCAN_BLOCK

TRAINER, PHASE = "trainer", "phase"
FILES = (
    (TRAINER, 10_000, None),
    (TRAINER, 100_000, None),
    (TRAINER, 1_000_000, None),
    (TRAINER, 1_000_000, 2),
    (PHASE, 100_000, None),
    (PHASE, 1_000_000, None),
    (PHASE, 1_000_000, 2),
)
"""Each timeline judged: its shape, its checkpoints and the seed of :func:`write_timeline`."""
TRAIN, VALIDATION = 704, 176

STEPS = {
    "report": "import runpy; "
    "sys.argv = ['leakgate', 'report', sys.argv[1], '-o', sys.argv[2] + '/report.md']; "
    "runpy.run_module('harness', run_name='__main__')",
    "gate": "import os, runpy; "
    "sys.argv = ['leakgate', 'gate', os.path.dirname(sys.argv[1])]; "
    "runpy.run_module('harness', run_name='__main__')",
    "merge": "import runpy; "
    "sys.argv = ['leakgate', 'merge', sys.argv[1], '--directory', sys.argv[2]]; "
    "runpy.run_module('harness', run_name='__main__')",
    "judge": "from harness._timeline.jsonl import read_timeline; "
    "from harness._results.finish import rules_of; from harness import judge; "
    "t = read_timeline(sys.argv[1]); v = judge(t.samples, rules_of(t.header)); "
    "print(v.status, t.reader, "
    "getattr(t.samples, 'nbytes', lambda: float('nan'))() / len(t.samples))",
    "columns": "from harness._timeline.jsonl import read_timeline; "
    "from harness._results.finish import rules_of; from harness._rules.context import Context; "
    "t = read_timeline(sys.argv[1]); c = Context(t.samples, rules_of(t.header)); "
    "print(len(c.groups), t.reader, "
    "getattr(t.samples, 'nbytes', lambda: float('nan'))() / len(t.samples))",
}
"""What the child runs for each step, on the timeline named by ``sys.argv[1]``, with a folder
of its own for what it writes in ``sys.argv[2]``."""
SHAPE_STEPS = {TRAINER: ("report", "judge", "columns"), PHASE: ("report", "gate", "merge")}
"""The steps each shape runs."""


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


def write_timeline(
    path: Path, checkpoints: int, seed: int | None = None, shape: str = TRAINER
) -> int:
    """A timeline of about ``checkpoints`` samples of ``shape``; returns how many were written.
    ``seed`` draws the readings (by default ``checkpoints``) and, when given, moves the start
    time by a seventh of that many seconds: the times' text lengths, and so where lines end,
    change with it (seed 2 at 1M in the trainer's shape puts a line end 16 bytes before a
    2 MiB block boundary)."""
    rnd = random.Random(checkpoints if seed is None else seed)
    header = {
        "leakgate_timeline": 2,
        "probe": "cpu",
        "primary": "allocated",
        "metrics": ["allocated", "rss", "peak"],
        "rules": {
            "phase": ["validation"] if shape == PHASE else ["training", "validation"],
            "max_growth": "256KB",
            "warmup": 5,
        },
        "rank": 0,
        "world_size": 1,
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
        if shape == PHASE:
            loops = [("validation", "VALIDATION", 0, checkpoints - 4)]
        else:
            epochs = range(max(1, (checkpoints - 2) // (TRAIN + VALIDATION + 4)))
            loops = [
                loop
                for epoch in epochs
                for loop in (
                    ("training", "TRAIN", epoch, TRAIN),
                    ("validation", "VALIDATION", epoch, VALIDATION),
                )
            ]
        for phase, name, epoch, batches in loops:
            start, end = (
                ("EPOCH_START", "EPOCH_END")
                if name == "TRAIN"
                else (f"{name}_START", f"{name}_END")
            )
            line(start, phase, epoch, None)
            for batch in range(batches):
                line(f"{name}_BATCH", phase, epoch, batch)
            line(end, phase, epoch, None)
        line("SESSION_END", "session", None, None)
        out.write(json.dumps({"leakgate_end": {"error": None}}) + "\n")
    return count


def block_edges(path: Path) -> int:
    """How many lines end 16 bytes before a boundary of the columnar reader's scan blocks
    (:data:`~harness._timeline.columns.SCAN_BLOCK`, counted from the first sample line): where
    the reader used to find an "empty line" and hand the whole file to the line reader."""
    data = path.read_bytes()
    start = data.index(b"\n") + 1
    ends = range(start + SCAN_BLOCK - 16, len(data), SCAN_BLOCK)
    return sum(data[at] == ord("\n") for at in ends)


@pytest.fixture(scope="module")
def timelines(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple, tuple[Path, int, int]]:
    """Each of :data:`FILES` written, each in a folder of its own as ``run.rank0.jsonl``: its
    path, checkpoints and :func:`block_edges`."""
    folder = tmp_path_factory.mktemp("scale")
    made = {}
    for shape, size, seed in FILES:
        path = folder / f"{shape}-{size}-{seed}" / "run.rank0.jsonl"
        path.parent.mkdir()
        count = write_timeline(path, size, seed, shape)
        made[shape, size, seed] = (path, count, block_edges(path))
    return made


@pytest.mark.parametrize(
    ("shape", "size", "seed", "step"),
    [(*file, step) for file in FILES for step in SHAPE_STEPS[file[0]]],
)
def test_scale(benchmark, timelines, shape, size, seed, step, tmp_path):
    path, count, edges = timelines[shape, size, seed]
    if step == "gate" and not path.with_name("run.json").exists():
        _measured(child_code("merge"), path, path.parent)  # the merged verdict the gate reads
    result = benchmark.pedantic(_measured, (child_code(step), path, tmp_path), rounds=1)
    benchmark.extra_info.update(result, checkpoints=count, block_edges=edges)


def _measured(code: str, path: Path, folder: Path) -> dict[str, object]:
    """Seconds, peak resident bytes (the child's ``VmHWM``), exit code and last output line of
    one child process on the timeline ``path``, writing into ``folder``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryFile() as output:
        started = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-c", code, str(path), str(folder)],
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

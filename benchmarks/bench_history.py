"""Reading a memory history at scale: 1,000 and 10,000 runs of 1,000 tests each.

A history is written as ``pytest --memreport-history`` writes it (one parquet file per run, the
store's schema, a run's rows in one file), from a seeded generator: every test's peak and
growth flat with a little noise, but for one test in a hundred, whose peak steps up by a fifth
ten runs before the last (inside the page's window and the creep gate's: the 10 tests the
``creep`` step must name). Each step then runs in a child process, its wall time and peak resident
memory (the child's ``VmHWM``) kept:

- ``page``: ``python -m harness history DIR -o page.md``: every series read (its last 100
  runs), its steps and creep found, a chart each (1,000 charts);
- ``creep``: what ``leakgate gate --history DIR --max-creep`` reads after appending: the last 20
  runs of each of the 1,000 tests on one machine fingerprint, each judged for creep;
- ``one test``: ``python -m harness history DIR --test test_0007 -o page.md``.

The peak memory at 10,000 runs against 1,000 says whether reading is bounded: the rows kept
are each series' window, whatever the history's length.

    pytest benchmarks/bench_history.py
"""

from __future__ import annotations

import datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from bench_scale import _measured as measured

from harness._history.archive import SCHEMA, open_history

TESTS = 1_000
SIZES = (1_000, 10_000)
MIB = 2**20

STEPS = {
    "page": "import runpy; "
    "sys.argv = ['leakgate', 'history', sys.argv[1], '-o', sys.argv[2] + '/page.md']; "
    "runpy.run_module('harness', run_name='__main__')",
    "creep": "from harness._history.archive import open_history, HistoryPlace, HistoryRow; "
    "from harness._history.gating import creep_lines; "
    "from harness._history.creep import CreepLimit; "
    "h = open_history(sys.argv[1]); "
    "rows = [HistoryRow(None, None, None, None, 'r', 'b', f'tests/test_m.py::test_{t:04d}', "
    "'allocated', None, None, None, 'PASS', None, 'fp-bench', None, None, None, None, None) "
    "for t in range(1000)]; "
    "found = creep_lines(h, rows, CreepLimit.parse('10%/20'), min_bytes=2**20); "
    "print(len(found.crept), 'crept', len(found.notes), 'notes')",
    "one test": "import runpy; "
    "sys.argv = ['leakgate', 'history', sys.argv[1], '--test', 'test_0007', "
    "'-o', sys.argv[2] + '/page.md']; "
    "runpy.run_module('harness', run_name='__main__')",
}
"""What the child runs for each step, on the history ``sys.argv[1]``, writing into
``sys.argv[2]``."""


def write_history(folder: Path, runs: int, seed: int = 0) -> None:
    """``runs`` runs of :data:`TESTS` tests, one file each, as the store names and writes them."""
    history = open_history(folder, mode="append")
    rng = np.random.default_rng(seed)
    tests = pa.array([f"tests/test_m.py::test_{t:04d}" for t in range(TESTS)])
    stepping = np.arange(TESTS) % 100 == 7
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    constant = {
        "dirty": pa.array(np.zeros(TESTS, bool)),
        "branch": pa.array(["main"] * TESTS),
        "source": pa.array(["pytest"] * TESTS),
        "metric": pa.array(["allocated"] * TESTS),
        "status": pa.array(["PASS"] * TESTS),
        "holder": pa.nulls(TESTS, pa.string()),
        "fingerprint": pa.array(["fp-bench"] * TESTS),
        "device": pa.array(["cpu"] * TESTS),
        "device_model": pa.array(["x86_64 (16 CPUs)"] * TESTS),
        "torch": pa.array(["2.13.0+cpu"] * TESTS),
        "cpu_model": pa.array(["a cpu"] * TESTS),
        "cores": pa.array(np.full(TESTS, 16, np.int32)),
    }
    for i in range(runs):
        when = start + datetime.timedelta(minutes=i)
        run = f"{when:%Y%m%dT%H%M%S%f}-{i:012x}"
        peak = 100 * MIB * (1 + 0.01 * rng.standard_normal(TESTS))
        peak[stepping] *= 1.2 if i >= runs - 10 else 1.0
        columns = {
            **constant,
            "commit": pa.array([f"{i:040x}"] * TESTS),
            "time": pa.array([when] * TESTS, pa.timestamp("us", tz="UTC")),
            "run": pa.array([run] * TESTS),
            "test": tests,
            "growth": pa.array(64 * 1024 * rng.standard_normal(TESTS)),
            "peak": pa.array(peak),
            "teardown": pa.array(np.zeros(TESTS)),
        }
        table = pa.table([columns[f.name] for f in SCHEMA], schema=SCHEMA)
        pq.write_table(table, history.path + f"/{run}.parquet", compression="zstd")


@pytest.fixture(scope="module")
def histories(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Path, int]]:
    """Each size of :data:`SIZES` written: its folder and its bytes on disk."""
    made = {}
    for runs in SIZES:
        folder = tmp_path_factory.mktemp("history") / f"h{runs}"
        write_history(folder, runs)
        made[runs] = (folder, sum(p.stat().st_size for p in folder.iterdir()))
    return made


@pytest.mark.parametrize(("runs", "step"), [(r, s) for r in SIZES for s in STEPS])
def test_history(benchmark, histories, runs, step, tmp_path):
    folder, size = histories[runs]
    result = benchmark.pedantic(_measured, (STEPS[step], folder, tmp_path), rounds=1)
    benchmark.extra_info.update(result, runs=runs, tests=TESTS, rows=runs * TESTS, disk=size)
    assert result["exit"] == 0, result
    if step == "creep":
        assert result["last"] == f"{TESTS // 100} crept 0 notes", result


def _measured(code: str, folder: Path, out: Path) -> dict[str, object]:
    """:func:`bench_scale._measured` of ``code`` (its ``VmHWM`` printed however it ends) on
    the history ``folder``, writing into ``out``."""
    wrapped = (
        f"import re, sys\ntry:\n    {code}\nfinally:\n"
        "    print('VmHWM', re.search(r'VmHWM:\\s*(\\d+)', "
        "open('/proc/self/status').read()).group(1))"
    )
    return measured(wrapped, folder, out)

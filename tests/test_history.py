"""The history of memory across commits: the store (one parquet file per run, whole or
absent), appending from pytest and the gate, the creep gate, the page of series, and bad
input refused with one line."""

import copy
import datetime
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness._core.errors import BadInput
from harness._frontends.cli import main
from harness._history.archive import (
    HistoryPlace,
    HistoryRow,
    append,
    history_summary,
    open_history,
    scan,
)
from harness._history.creep import DEFAULT_CREEP, CreepLimit, by_commit, creep, steps
from harness._history.series import Selection, read_series

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "reports" / "examples" / "tft-train-clean.json"
MIB = 2**20
START = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
HOLDER = {
    "path": "Forecaster.attention_cache",
    "container": "list",
    "items": 40,
    "tensors": 40,
    "bytes": 12 * MIB,
    "graph_bytes": 0,
    "sites": [],
    "phase": "validation",
    "epoch": 0,
    "label": "VALIDATION_BATCH",
    "note": "",
    "growth": 12 * MIB,
}


def verdict(peak: float, growth: float = 0.0, holder: bool = True) -> dict:
    """The example's clean verdict, its highest peak above start ``peak`` bytes, its worst
    growth ``growth``, and a holder."""
    document = json.loads(EXAMPLE.read_text())
    for phase in document["phases"]:
        phase["peak_rise"] = int(peak)
    document["worst_growth"] = growth
    document["attribution"] = [copy.deepcopy(HOLDER)] if holder else []
    return document


def row(i: int, peak: float, *, test="t.py::test_x", fingerprint="fp-a", growth=0.0, commit=None):
    """The ``i``-th run of a test, an hour after the one before, at commit ``c<i>``."""
    return HistoryRow(
        commit=commit or f"c{i:03d}",
        dirty=False,
        branch="main",
        time=START + datetime.timedelta(hours=i),
        run=f"{i:06d}-{test.replace('/', '_')}-{fingerprint}",
        source="test",
        test=test,
        metric="allocated",
        growth=growth,
        peak=peak,
        teardown=0.0,
        status="PASS",
        holder=None,
        fingerprint=fingerprint,
        device="cpu",
        device_model="x86_64 (2 CPUs)",
        torch="2.13.0+cpu",
        cpu_model="a cpu",
        cores=2,
    )


def built(folder: Path, peaks, **kwargs) -> Path:
    history = open_history(folder, mode="append")
    for i, peak in enumerate(peaks):
        append(history, [row(i, peak, **kwargs)])
    return folder


def creeping(runs: int, start: int, step: float = 0.04, noise: float = 0.003, seed: int = 0):
    """Peaks flat at 100 MiB up to run ``start``, then ``step`` more at each commit."""
    rng = np.random.default_rng(seed)
    return [
        100 * MIB * (1 + step) ** max(0, i - start + 1) * (1 + noise * rng.normal())
        for i in range(runs)
    ]


def one_line_exit_2(capsys, argv, text):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and text in err, err


def gated_with_history(tmp_path, capsys, peaks_before, peak_now, *args):
    """Gate a folder holding one verdict (``peak_now``) with a history that already holds
    ``peaks_before`` for the same test on this machine; the exit code and the output."""
    document = verdict(peak_now)
    mine = HistoryPlace.here().rows([history_summary(document)], "test")[0]
    history = open_history(tmp_path / "history", mode="append")
    for i, peak in enumerate(peaks_before):
        made = row(i, peak, test=mine.test, fingerprint=mine.fingerprint)
        append(history, [made])
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "run.json").write_text(json.dumps(document))
    code = main(["gate", str(reports), "--history", str(tmp_path / "history"), *args])
    return code, capsys.readouterr().out


def test_a_four_percent_creep_over_20_commits_fails_naming_its_first_commit(tmp_path, capsys):
    peaks = creeping(21, start=6)  # flat to c005; c006 is the first commit of the rise
    code, out = gated_with_history(tmp_path, capsys, peaks[:-1], peaks[-1], "--max-creep")
    assert code == 1, out
    crept = [line for line in out.splitlines() if line.startswith("creep:")]
    assert len(crept) == 1 and " peak " in crept[0], out
    assert "since c006" in crept[0] and "over the last 20 runs" in crept[0]
    assert "Forecaster.attention_cache" in crept[0]  # the holder now
    index = (tmp_path / "reports" / "index.md").read_text()
    assert "since c006" in index and "FAIL" in index
    # each step was within the gate's 10% tolerance
    assert max(b / a for a, b in itertools.pairwise(peaks)) < 1.10


def test_a_flat_noisy_history_passes_the_creep_gate(tmp_path, capsys):
    rng = np.random.default_rng(3)
    peaks = [100 * MIB * (1 + 0.05 * rng.normal()) for _ in range(20)]
    code, out = gated_with_history(tmp_path, capsys, peaks, 100 * MIB, "--max-creep=10%/20")
    assert code == 0, out
    assert "creep:" not in out and "history: appended 1 run" in out


def test_with_fewer_than_5_comparable_runs_the_gate_decides_nothing(tmp_path, capsys):
    code, out = gated_with_history(tmp_path, capsys, [50 * MIB, 80 * MIB], 200 * MIB, "--max-creep")
    assert code == 0, out
    assert "not enough history (3 comparable runs, 5 needed): nothing decided" in out


def test_the_creep_rule_names_the_start_of_the_rise_and_passes_flat_series():
    limit = CreepLimit.parse(DEFAULT_CREEP)
    peaks = np.array(creeping(20, start=8))
    found = creep(by_commit([f"c{i}" for i in range(20)], peaks), limit, min_bytes=MIB)
    assert found.crept and found.since == "c8" and found.fraction > 0.10
    flat = np.full(20, 100.0 * MIB)
    assert creep(by_commit([f"c{i}" for i in range(20)], flat), limit, min_bytes=MIB).crept is False


def test_repeated_runs_of_a_commit_are_its_noise():
    commits = ["a", "a", "a", "b", "b", "b", "c", "c", "c"]
    values = np.array([10.0, 12.0, 8.0, 10.0, 11.0, 9.0, 10.0, 10.0, 10.0]) * MIB
    found = by_commit(commits, values)
    assert found.names == ["a", "b", "c"] and found.runs == 9
    assert list(found.values) == [10 * MIB] * 3 and found.noise > MIB


def test_a_single_step_is_found_at_its_commit(tmp_path, capsys):
    rng = np.random.default_rng(5)
    peaks = [(100 if i < 12 else 130) * MIB * (1 + 0.01 * rng.normal()) for i in range(25)]
    built(tmp_path / "h", peaks)
    found = steps(by_commit([f"c{i:03d}" for i in range(25)], np.array(peaks)), min_bytes=MIB)
    assert found == [12]
    assert main(["history", str(tmp_path / "h"), "-o", str(tmp_path / "page.md")]) == 0
    page = (tmp_path / "page.md").read_text()
    moved = page.split("## Moved")[1].split("## HistorySeries")[0]
    assert "`c012`: +29.4MiB (+29%)" in moved and "since `c012`" in moved and "test_x" in moved
    assert "```mermaid" in page and "xychart-beta" in page


def test_two_fingerprints_are_never_one_series(tmp_path, capsys):
    folder = tmp_path / "h"
    history = open_history(folder, mode="append")
    for i in range(20):  # machine a at 100 MiB, then machine b at 150 MiB: mixed, a step
        fingerprint, peak = ("fp-a", 100) if i < 10 else ("fp-b", 150)
        append(history, [row(i, peak * MIB, fingerprint=fingerprint)])
    series = read_series(history, Selection(), window=100)
    assert sorted((s.fingerprint, len(s.commits)) for s in series) == [("fp-a", 10), ("fp-b", 10)]
    assert main(["history", str(folder)]) == 0
    page = capsys.readouterr().out
    assert "No series stepped or crept." in page and "2 machine fingerprints" in page


def test_the_gate_never_fails_on_a_trend_across_fingerprints(tmp_path, capsys):
    document = verdict(150 * MIB)
    mine = HistoryPlace.here().rows([history_summary(document)], "test")[0]
    history = open_history(tmp_path / "history", mode="append")
    for i in range(20):  # another machine at 100 MiB: this one's 150 MiB is no creep
        append(history, [row(i, 100 * MIB, test=mine.test, fingerprint="another")])
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "run.json").write_text(json.dumps(document))
    argv = ["gate", str(reports), "--history", str(tmp_path / "history"), "--max-creep"]
    assert main(argv) == 0
    assert "not enough history (1 comparable runs" in capsys.readouterr().out


WRITER = """
import datetime, sys
from harness._history.archive import HistoryRow, append, open_history
history = open_history(sys.argv[1], mode="append")
for k in range(int(sys.argv[3])):
    rows = [
        HistoryRow(commit="c", dirty=False, branch="b", time=datetime.datetime.now(datetime.UTC),
            run=f"{sys.argv[2]}-{k}", source="test", test=f"t{t}", metric="allocated",
            growth=0.0, peak=1.0, teardown=0.0, status="PASS", holder=None, fingerprint="f",
            device="cpu", device_model="m", torch="t", cpu_model="c", cores=1)
        for t in range(10)
    ]
    append(history, rows)
"""


def test_concurrent_writers_lose_no_row(tmp_path):
    folder = tmp_path / "h"
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(folder), f"w{n}", "5"])
        for n in range(4)
    ]
    assert [w.wait() for w in writers] == [0] * 4
    history = open_history(folder)
    runs = [r for b in scan(history, ("run",)) for r in b.column("run").to_pylist()]
    assert len(runs) == 4 * 5 * 10 and len(set(runs)) == 20
    assert len(history.files()) == 20


KILLED = (
    """
import os, signal, sys
real = os.replace
def killed(src, dst, *a, **k):  # the writer is killed as it is about to rename its file
    if str(dst).endswith(".parquet"):
        os.kill(os.getpid(), signal.SIGKILL)
    return real(src, dst, *a, **k)
os.replace = killed
"""
    + WRITER
)


def test_a_killed_writer_leaves_no_file_that_is_read(tmp_path, capsys):
    folder = built(tmp_path / "h", [100 * MIB] * 3)
    done = subprocess.run([sys.executable, "-c", KILLED, str(folder), "killed", "1"], check=False)
    assert done.returncode == -9
    left = [p.name for p in folder.iterdir()]
    assert any(name.startswith(".") and name.endswith(".tmp") for name in left), left
    history = open_history(folder)
    assert len(history.files()) == 3
    runs = [r for b in scan(history, ("run",)) for r in b.column("run").to_pylist()]
    assert len(runs) == 3
    assert main(["history", str(folder)]) == 0
    assert "1 test on 1 machine fingerprint" in capsys.readouterr().out


def test_bad_inputs_exit_2_with_one_line(tmp_path, capsys):
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    one_line_exit_2(capsys, ["history", str(tmp_path / "a_file")], "a history is a folder")
    one_line_exit_2(capsys, ["history", str(tmp_path / "other")], "not a history")
    one_line_exit_2(capsys, ["history", str(tmp_path / "none")], "no such history")
    one_line_exit_2(capsys, ["history", "nosuchscheme://x/y"], "cannot open the history")
    folder = built(tmp_path / "h", [MIB] * 3)
    one_line_exit_2(capsys, ["history", str(folder), "--since", "zz"], "--since")
    one_line_exit_2(capsys, ["history", str(folder), "--since", "abcdef"], "no run of commit")
    pq.write_table(pa.table({"a": [1, 2]}), folder / "foreign.parquet")
    one_line_exit_2(capsys, ["history", str(folder)], "foreign.parquet: not a leakgate history")
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "run.json").write_text(json.dumps(verdict(MIB)))
    gate = ["gate", str(reports)]
    one_line_exit_2(capsys, [*gate, "--history", str(tmp_path / "other")], "not a history")
    one_line_exit_2(capsys, [*gate, "--max-creep"], "needs --history")
    assert "REFUSED" in (reports / "index.md").read_text()
    assert main([*gate, "--history", str(tmp_path / "h2"), "--max-creep=ten"]) == 2
    assert "PCT/RUNS" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "other").iterdir()] == ["notes.txt"]


def test_since_and_test_select_rows(tmp_path, capsys):
    folder = tmp_path / "h"
    history = open_history(folder, mode="append")
    for i in range(6):
        append(history, [row(i, MIB, test="a.py::test_keep"), row(i, MIB, test="b.py::other")])
    picked = read_series(history, Selection(test="keep"), window=100)
    assert [s.test for s in picked] == ["a.py::test_keep"]
    assert main(["history", str(folder), "--since", "c003", "--test", "a.py::*"]) == 0
    page = capsys.readouterr().out
    assert "3 commits" in page and "other" not in page
    assert main(["history", str(folder), "--since", "2026-01-01T04:00"]) == 0
    assert "2 commits" in capsys.readouterr().out


def test_a_window_keeps_each_series_last_runs(tmp_path, monkeypatch):
    import harness._history.series as series_module

    monkeypatch.setattr(series_module, "COMPACT", 7)  # compact while reading, many times
    folder = built(tmp_path / "h", [float(i) * MIB for i in range(30)])
    (found,) = read_series(open_history(folder), Selection(), window=12)
    assert found.commits == [f"c{i:03d}" for i in range(18, 30)]
    assert list(found.peak / MIB) == list(range(18, 30))


PASSING = """
import pytest

@pytest.mark.memleak(phase="test", max_growth="50MB", warmup=0)
def test_kept(memtrace):
    for i in range(4):
        memtrace.checkpoint("STEP", phase="test", batch=i)
"""


def test_pytest_memreport_history_appends_a_row_per_traced_test(pytester):
    pytester.makepyfile(test_loop=PASSING)
    for _ in range(2):
        result = pytester.runpytest("-p", "no:randomly", "--memreport-history=hist")
        assert "leakgate history: appended 1 test to hist" in result.stdout.str()
    history = open_history(pytester.path / "hist")
    rows = pa.Table.from_batches(list(scan(history, ("test", "status", "source", "cores"))))
    assert rows.column("test").to_pylist() == ["test_loop.py::test_kept"] * 2
    assert set(rows.column("source").to_pylist()) == {"pytest"}
    assert rows.column("cores").to_pylist() == [os.cpu_count()] * 2


def test_pytest_refuses_a_bad_history_before_any_test_runs(pytester):
    pytester.makepyfile(test_ran="def test_ran():\n    open('ran', 'w').close()\n")
    (pytester.path / "a_file").write_text("x")
    (pytester.path / "full").mkdir()
    (pytester.path / "full" / "x.txt").write_text("x")
    for folder, text in (("a_file", "a history is a folder"), ("full", "not a history")):
        result = pytester.runpytest("-p", "no:randomly", f"--memreport-history={folder}")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        errors = [line for line in result.stderr.lines if line.strip()]
        assert len(errors) == 1 and text in errors[0] and "--memreport-history" in errors[0]
        assert not (pytester.path / "ran").exists()


@settings(derandomize=True, max_examples=25, deadline=None)
@given(
    level=st.floats(1 * MIB, 10 * 2**30),
    spread=st.floats(0.0, 0.5),
    tails=st.sampled_from(["normal", "heavy", "spikes"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_creep_false_alarms_on_flat_noisy_series_are_at_most_1_percent(level, spread, tails, seed):
    rng = np.random.default_rng(seed)
    limit = CreepLimit.parse(DEFAULT_CREEP)
    names = [f"c{i}" for i in range(limit.runs)]
    trials, alarms = 200, 0
    for _ in range(trials):
        if tails == "normal":
            noise = rng.normal(size=limit.runs)
        elif tails == "heavy":
            noise = rng.standard_t(2, size=limit.runs)
        else:
            noise = rng.normal(size=limit.runs) + 5 * (rng.random(limit.runs) < 0.1)
        values = level * np.maximum(1 + spread * noise, 0.01)
        alarms += bool(creep(by_commit(names, values), limit, min_bytes=MIB).crept)
    assert alarms <= trials // 100


def test_an_object_store_history_is_written_under_a_hidden_name_then_moved():
    import fsspec
    import pyarrow.fs as pafs

    from harness._history.archive import MARKER, History

    moves = []

    class Bucket(pafs.FSSpecHandler):
        def move(self, src, dest):
            moves.append((src.rsplit("/", 1)[1], dest.rsplit("/", 1)[1]))
            super().move(src, dest)

    bucket = pafs.PyFileSystem(Bucket(fsspec.filesystem("memory")))
    bucket.create_dir("/bucket/history")
    history = History(bucket, "/bucket/history", "memory://bucket/history")
    assert not history.local
    for i in range(3):
        append(history, [row(i, MIB)])
    names = [i.base_name for i in bucket.get_file_info(pafs.FileSelector("/bucket/history"))]
    assert len(history.files()) == 3 and not [n for n in names if n.startswith(".")]
    assert len(moves) == 3 and all(a.startswith(".") and b.endswith(".parquet") for a, b in moves)
    (found,) = read_series(history, Selection(), window=10)
    assert found.commits == ["c000", "c001", "c002"]
    assert MARKER not in names  # made by open_history(mode="append"), not by append


def test_a_file_uri_is_a_local_history(tmp_path, capsys):
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "run.json").write_text(json.dumps(verdict(MIB)))
    uri = (tmp_path / "history").as_uri()
    assert main(["gate", str(reports), "--history", uri]) == 0
    assert main(["history", uri]) == 0
    assert "1 test on 1 machine fingerprint" in capsys.readouterr().out


def test_the_gate_reads_the_newest_runs_and_no_further_than_its_window(tmp_path):
    folder = built(tmp_path / "h", [MIB] * 30)
    pq.write_table(pa.table({"a": [1]}), folder / "00000000T000000000000-old.parquet")
    history = open_history(folder)
    with pytest.raises(BadInput, match=r"old\.parquet: not a leakgate history"):
        read_series(history, Selection(), window=5)  # the whole history: the foreign file too
    chosen = Selection(metric="allocated", fingerprint="fp-a", tests=frozenset({"t.py::test_x"}))
    (found,) = read_series(history, chosen, window=5)
    assert found.commits == [f"c{i:03d}" for i in range(25, 30)]

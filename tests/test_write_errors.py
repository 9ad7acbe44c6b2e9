"""Writes that fail while a run is recorded: a full disk at the end record or mid-run, a file
size limit, a planted link, a place that cannot hold a folder. Each takes the one write-error
path (the plugin warns once, a command prints one line and exits 2), never a traceback."""

import errno
import json
import os
import resource
import subprocess
import sys

import pytest

from harness._core.errors import UnwritableReport
from harness._recorder import Recorder
from harness._results.finish import finish_run
from harness._timeline import writer as timeline_writer
from harness._timeline.jsonl import TimelineWriter, read_timeline
from harness._verdict.options import Rules
from tft import train as train_cli
from tft.synthetic import synth

RULES = Rules(phase="loop", warmup=1, max_growth="1GiB")


def no_space(writer: TimelineWriter, *args: object) -> None:
    """A writer's write on a full disk, as the writer reports it."""
    text = "cannot write the timeline (No space left on device)"
    raise OSError(errno.ENOSPC, text, str(writer.path))


def record(recorder: Recorder, batches: int = 8) -> None:
    with recorder.phase("loop", epoch=0):
        for batch in range(batches):
            recorder.checkpoint("BATCH", batch=batch)


# -- case 3: the end record, and lines before it, on a full disk ---------------------------


def test_an_end_record_on_a_full_disk_is_the_runs_write_error(tmp_path, monkeypatch):
    monkeypatch.setattr(TimelineWriter, "end", no_space)
    with Recorder("cpu", timeline=tmp_path / "run.jsonl", rules=RULES) as recorder:
        record(recorder)
        finished = finish_run(recorder, name="run", directory=tmp_path)
    assert isinstance(finished.write_error, UnwritableReport)
    assert finished.write_error.reason == "No space left on device"
    assert finished.verdict.status == "PASS"
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "PASS"
    assert (tmp_path / "run.md").exists()


def fills_up(monkeypatch: pytest.MonkeyPatch, appends: int) -> list[bytes]:
    """The timeline's disk full after ``appends`` appends, which the returned list keeps."""
    written: list[bytes] = []
    real = timeline_writer._Appended.append

    def append(self, line):
        if len(written) == appends:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(self, line)
        written.append(line)

    monkeypatch.setattr(timeline_writer._Appended, "append", append)
    return written


def test_a_full_disk_mid_run_stops_the_timeline_not_the_run(tmp_path, monkeypatch):
    written = fills_up(monkeypatch, 3)
    with Recorder("cpu", timeline=tmp_path / "run.jsonl", rules=RULES) as recorder:
        record(recorder)
        assert len(recorder.samples) == 10 and len(written) == 3
        finished = finish_run(recorder, name="run", directory=tmp_path)
    monkeypatch.undo()
    assert finished.write_error is recorder.timeline_error
    assert str(finished.write_error) == (
        f"cannot write {tmp_path / 'run.jsonl'}: No space left on device"
    )
    kept = read_timeline(tmp_path / "run.jsonl")
    assert len(kept.samples) == 3 and kept.end is None
    assert finished.verdict.status == "PASS"


def test_a_full_disk_in_a_long_loop_keeps_no_line_waiting(tmp_path, monkeypatch):
    """Once the timeline is lost, a long loop's batches between two stride readings go to the
    store alone: none waits in memory for a line that will never be written."""
    fills_up(monkeypatch, 40)
    with Recorder("cpu", timeline=tmp_path / "run.jsonl", rules=RULES) as recorder:
        record(recorder, batches=400)
        assert recorder.timeline_error is not None
        assert recorder._timeline is not None and not recorder._timeline._waiting
        assert [s.batch for s in recorder.samples][1:-1] == list(range(400))


MANY = """
import pytest

@pytest.mark.memleak(phase="loop", warmup=1, max_growth="1GiB")
def test_loop(memtrace):
    with memtrace.phase("loop", epoch=0):
        for i in range(8):
            memtrace.checkpoint("BATCH", batch=i)
"""


def test_the_plugin_warns_once_when_the_end_record_cannot_be_written(pytester, monkeypatch):
    monkeypatch.setattr(TimelineWriter, "end", no_space)
    pytester.makepyfile(test_many=MANY)
    result = pytester.runpytest("-p", "no:randomly", "--memreport=out")
    result.assert_outcomes(passed=1)
    assert result.ret == 0
    assert "INTERNALERROR" not in result.stdout.str()
    result.stdout.fnmatch_lines(
        ["leakgate warning: reports were not all written (*.jsonl: No space left on device)*"]
    )


# -- case 9: python -m tft.train --memreport where the timeline cannot be written -----------


@pytest.fixture(scope="module")
def bars(tmp_path_factory):
    """Few bars: 12 training and 4 validation windows, a traced epoch in about a second."""
    return synth(tmp_path_factory.mktemp("bars") / "tiny.parquet", rows=300)


TRAIN = ["--epochs", "1", "--hidden-size", "8", "--log-level", "warning"]


def test_tft_train_refuses_a_link_planted_at_its_timeline(bars, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(train_cli, "warm_up", lambda *args: None)
    outside = tmp_path / "outside"
    outside.write_text("keep")
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "tft-train-clean.jsonl").symlink_to(outside)
    argv = ["--parquet-file", str(bars), *TRAIN, "--memreport", str(reports)]
    assert train_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: {reports / 'tft-train-clean.jsonl'}: "
        "cannot write the timeline (a symbolic link is in the way)\n"
    )
    assert outside.read_text() == "keep" and os.listdir(reports) == ["tft-train-clean.jsonl"]


def test_tft_train_refuses_a_folder_that_cannot_be_made(bars, capsys, monkeypatch):
    monkeypatch.setattr(train_cli, "warm_up", lambda *args: None)
    argv = ["--parquet-file", str(bars), *TRAIN, "--memreport", "/proc/nope"]
    assert train_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("error: /proc/nope")


def test_tft_train_hitting_a_file_size_limit_mid_run_exits_2_with_one_line(bars, tmp_path):
    """A real ``ulimit -f`` (EFBIG once the timeline reaches 4 KiB, its header and a few
    lines): the run still finishes and prints its verdict; the error is one line, exit 2."""
    limit = 4096

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    reports = tmp_path / "reports"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tft.train",
            "--parquet-file",
            str(bars),
            *TRAIN,
            "--memreport",
            str(reports),
        ],
        capture_output=True,
        text=True,
        preexec_fn=small_files,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("error: cannot write ") and "File too large" in done.stderr
    assert "memory verdict:" in done.stdout
    timeline = reports / "tft-train-clean.jsonl"
    assert 0 < timeline.stat().st_size <= limit
    assert read_timeline(timeline).end is None

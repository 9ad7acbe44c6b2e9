"""Writes that fail while a run is recorded: a full disk at the end record or mid-run, a file
size limit, a planted link, a place that cannot hold a folder. Each takes the one write-error
path (the plugin warns once, a command prints one line and exits 2), never a traceback."""

import errno
import json

from harness.errors import UnwritableReport
from harness.finish import finish_run
from harness.recorder import Recorder
from harness.timeline import TimelineWriter, read_timeline
from harness.verdict import Rules

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


def test_a_full_disk_mid_run_stops_the_timeline_not_the_run(tmp_path, monkeypatch):
    written = []
    real = TimelineWriter.write

    def fills_up(self, sample):
        if len(written) == 3:
            no_space(self)
        real(self, sample)
        written.append(sample)

    monkeypatch.setattr(TimelineWriter, "write", fills_up)
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

"""The timeline writer's mapped file: what a SIGKILL leaves, what a phase's end and a close cut
back, and a file size limit or full disk as the run's write error."""

import dataclasses
import errno
import mmap
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import harness._measure.sample as schema
from harness._measure.sample import Sample
from harness._timeline import columns as timeline_columns
from harness._timeline import writer as timeline_writer
from harness._timeline.jsonl import TimelineWriter, read_timeline

ROOT = Path(__file__).resolve().parents[1]
HEADER = {"metrics": ["rss"]}


def _sample(batch: int, label: str = "TRAIN_BATCH", note: str | None = None) -> Sample:
    return Sample(label, "train", 0, batch, 1.5, {"rss": 1000 + batch}, note=note)


CHILD = """
import sys
from harness._measure.sample import Sample
from harness._timeline.jsonl import TimelineWriter

writer = TimelineWriter(sys.argv[1], {"metrics": ["rss"]})
batch = 0
while True:
    label = "train END" if batch % 500 == 499 else "TRAIN_BATCH"
    writer.write(Sample(label, "train", 0, batch, 1.5, {"rss": batch}, note="n" * (batch % 300)))
    batch += 1
    print(batch, flush=True)
"""


def killed(script: str, path: Path, after: int) -> int:
    """Run ``script`` on ``path`` in a child that says on a pipe how many lines it has written,
    SIGKILL it once it said ``after``; the last count it said."""
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert child.stdout is not None
    reported = 0
    while reported < after:
        reported = int(child.stdout.readline())
    child.send_signal(signal.SIGKILL)
    rest = child.stdout.read().split()
    child.stdout.close()
    assert child.wait(timeout=60) == -signal.SIGKILL
    return int(rest[-1]) if rest else reported


@pytest.mark.parametrize("kill_after", [1, 2500])
def test_every_checkpoint_recorded_before_a_sigkill_is_read_back(tmp_path, kill_after):
    """The child says on a pipe how many lines it has written; SIGKILL lands mid-loop, after
    several windows and phase ends; every line it reported, and any it wrote after, reads back."""
    path = tmp_path / "killed.jsonl"
    reported = killed(CHILD, path, kill_after)
    timeline = read_timeline(path)
    assert len(timeline.samples) >= reported and timeline.end is None
    assert [s.batch for s in timeline.samples] == list(range(len(timeline.samples)))
    assert [s.note for s in timeline.samples] == [
        "n" * (b % 300) for b in range(len(timeline.samples))
    ]


ROLES_CHILD = """
import sys
from harness._measure.sample import Sample
from harness._timeline.jsonl import TimelineWriter

writer = TimelineWriter(sys.argv[1], {"metrics": ["rss", "children_anon"]})
batch = 0
while True:
    metrics = {"rss": batch, "children_anon": 0}
    for worker in range(batch // 700):
        metrics[f"child_anon:worker {worker}"] = batch + worker
        metrics["children_anon"] += batch + worker
    writer.write(Sample("TRAIN_BATCH", "train", 0, batch, 1.5, metrics))
    batch += 1
    print(batch, flush=True)
"""


def test_a_killed_run_whose_workers_came_mid_run_is_read_in_columns(tmp_path, monkeypatch):
    """Workers' metrics appear after the header (one more every 700 checkpoints) and a killed
    run has no end record to name them: the columnar reader still reads every line."""
    monkeypatch.setattr(timeline_columns, "COLUMNS_FROM", 0)
    monkeypatch.setattr(timeline_columns, "PARSE_BLOCK", 1 << 12)
    path = tmp_path / "killed.jsonl"
    reported = killed(ROLES_CHILD, path, 2500)
    timeline = read_timeline(path)
    assert timeline.reader == "columns" and timeline.end is None
    assert len(timeline.samples) >= reported
    for batch, s in enumerate(timeline.samples):
        roles = {f"child_anon:worker {w}": batch + w for w in range(batch // 700)}
        total = sum(roles.values())
        assert (s.batch, s.get("rss"), s.get("children_anon")) == (batch, batch, total)
        read = {m: v for m, v in s.metrics.items() if m.startswith("child_anon:") and v is not None}
        assert read == roles


def test_a_phase_end_and_a_close_cut_the_file_to_its_lines(tmp_path):
    """Between phase ends the file holds reserved zeros past its lines, which the reader reads
    as its end; a phase's END, the end record and close leave exactly the lines. A line longer
    than the window gets one its size."""
    path = tmp_path / "t.jsonl"
    writer = TimelineWriter(path, HEADER)
    written = [_sample(0), _sample(1, note="x" * (3 * timeline_writer.WINDOW))]
    for sample in written:
        writer.write(sample)
    data = path.read_bytes()
    assert data.endswith(b"\0") and b"\0" not in data.rstrip(b"\0")
    assert read_timeline(path).samples == written and read_timeline(path).torn == 0
    written.append(_sample(2, label="train END"))
    writer.write(written[-1])
    assert not path.read_bytes().endswith(b"\0")
    assert read_timeline(path).samples == written
    written.append(_sample(3))
    writer.write(written[-1])
    writer.end(None)
    assert not path.read_bytes().endswith(b"\0")
    writer.close()
    read = read_timeline(path)
    assert (read.samples, read.end, read.torn) == (written, {"error": None}, 0)


def test_a_dropped_writer_leaves_only_its_lines(tmp_path):
    path = tmp_path / "t.jsonl"
    writer = TimelineWriter(path, HEADER)
    writer.write(_sample(0))
    del writer
    assert not path.read_bytes().endswith(b"\0")
    assert [s.batch for s in read_timeline(path).samples] == [0]


@pytest.mark.parametrize("columns", [True, False], ids=["columns", "lines"])
@pytest.mark.parametrize("torn", [b"", b'{"label":"TRAIN_'])
def test_zeros_past_the_lines_end_the_file_for_both_readers(tmp_path, monkeypatch, columns, torn):
    monkeypatch.setattr(timeline_columns, "COLUMNS_FROM", 0 if columns else 1 << 40)
    path = tmp_path / "t.jsonl"
    writer = TimelineWriter(path, HEADER)
    writer.write(_sample(0))
    writer.close()
    with path.open("ab") as file:
        file.write(torn + b"\0" * 9000)
    read = read_timeline(path)
    assert read.reader == ("columns" if columns else "lines")
    assert ([s.batch for s in read.samples], read.torn) == ([0], 1 if torn else 0)


@pytest.mark.parametrize("columns", [True, False], ids=["columns", "lines"])
@pytest.mark.parametrize("hole", [(0, 40), (5, 60), (1, 0)], ids=["head", "middle", "one-byte"])
def test_a_write_killed_halfway_ends_the_timeline_before_it(tmp_path, monkeypatch, columns, hole):
    """A kill inside the copy of a last write of several lines can leave its later bytes made
    and earlier ones still zero (a copy need not run in order): the timeline ends before that
    write, torn, for both readers, and nothing before it is lost."""
    monkeypatch.setattr(timeline_columns, "COLUMNS_FROM", 0 if columns else 1 << 40)
    path = tmp_path / "t.jsonl"
    writer = TimelineWriter(path, HEADER)
    for batch in range(10):
        writer.write(_sample(batch))
    writer.close()
    data = path.read_bytes()
    last = [data.find(b'"batch":%d,' % b) for b in (7, 8, 9)]
    start = data.rfind(b"\n", 0, last[0]) + 1  # batches 7 to 9 were the last write
    at, width = start + hole[0], hole[1] or 1
    path.write_bytes(data[:at] + b"\0" * width + data[at + width :] + b"\0" * 9000)
    read = read_timeline(path)
    assert ([s.batch for s in read.samples], read.torn) == (list(range(7)), 1)


@pytest.fixture
def file_size_limit():
    """Lower this process's file size limit (Python ignores SIGXFSZ, so a write past it is
    EFBIG), and restore it after."""
    before = resource.getrlimit(resource.RLIMIT_FSIZE)
    yield lambda limit: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, before[1]))
    resource.setrlimit(resource.RLIMIT_FSIZE, before)


def test_a_file_size_limit_is_the_write_error_and_keeps_the_lines(tmp_path, file_size_limit):
    path = tmp_path / "t.jsonl"
    writer = TimelineWriter(path, HEADER)
    file_size_limit(4 * timeline_writer.WINDOW)
    written = 0
    with pytest.raises(OSError, match="cannot write the timeline") as raised:
        while True:
            writer.write(_sample(written))
            written += 1
    assert raised.value.errno == errno.EFBIG and raised.value.filename == str(path)
    writer.close()
    assert [s.batch for s in read_timeline(path).samples] == list(range(written))
    assert written > 100


def test_a_forked_child_closing_its_copy_leaves_the_parents_file(tmp_path):
    """A DataLoader worker forked mid-run holds a copy of the writer; its closing it must not
    cut the file back to the lines written before the fork."""
    path = tmp_path / "t.jsonl"
    writer = TimelineWriter(path, HEADER)
    writer.write(_sample(0))
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        writer.close()
        os._exit(0)
    writer.write(_sample(1))
    assert os.waitpid(pid, 0)[1] == 0
    writer.write(_sample(2))
    writer.close()
    assert [s.batch for s in read_timeline(path).samples] == [0, 1, 2]


def _unread(batch: int) -> Sample:
    return Sample("TRAIN_BATCH", "train", 0, batch, 1.5, {"rss": None})


def test_an_unread_batchs_line_waits_for_the_next_line_or_the_close(tmp_path):
    """A loop's batch between two stride readings is written with the next line, in order,
    and by the close when no line follows."""
    path = tmp_path / "t.jsonl"
    writer = TimelineWriter(path, HEADER)
    writer.write(_sample(0))
    writer.wait(_unread(1))
    writer.wait(_unread(2))
    assert [s.batch for s in read_timeline(path).samples] == [0]
    writer.write_recorded(_sample(3))
    writer.wait(_unread(4))
    assert [s.batch for s in read_timeline(path).samples] == [0, 1, 2, 3]
    writer.close()
    samples = read_timeline(path).samples
    assert [s.batch for s in samples] == [0, 1, 2, 3, 4]
    assert samples[1] == _unread(1) and samples[4].metrics == {"rss": None}


def test_a_forked_copy_never_writes_its_parents_waiting_lines(tmp_path):
    """A DataLoader worker's copy of the writer holds its parent's waiting lines: neither its
    close nor its exit writes them (the parent does, once)."""
    path = tmp_path / "t.jsonl"
    writer = TimelineWriter(path, HEADER)
    writer.write(_sample(0))
    writer.wait(_unread(1))
    for ending in ("close", "exit"):
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child)
            # the close, or the finaliser that the interpreter's exit or a drop runs
            writer.close() if ending == "close" else writer._close()
            os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        assert [s.batch for s in read_timeline(path).samples] == [0]
    writer.close()
    assert [s.batch for s in read_timeline(path).samples] == [0, 1]


RECORDER_CHILD = """
import sys
from harness import Recorder

rec = Recorder("cpu", timeline=sys.argv[1])
batch = 0
while batch < int(sys.argv[2]):
    rec.checkpoint("TRAIN_BATCH", phase="train", batch=batch)
    batch += 1
    print(batch, flush=True)
"""


def test_a_recorder_killed_mid_loop_loses_no_reading_only_the_batches_after_the_last(tmp_path):
    """SIGKILL lands in a long loop: every reading made reads back, with every batch before
    the last one; what is lost is only the unread batches after it (fewer than the stride's
    step), whose lines waited for the next reading."""
    path = tmp_path / "killed.jsonl"
    reported = killed(RECORDER_CHILD.replace("int(sys.argv[2])", "2**40"), path, 300)
    samples = read_timeline(path).samples
    assert [s.batch for s in samples] == list(range(len(samples)))
    assert samples[-1].get("allocated") is not None
    assert len(samples) > reported - schema.STRIDE.every


def test_a_recorder_never_closed_writes_its_waiting_lines_at_the_interpreters_exit(tmp_path):
    """A script that never closes its recorder still leaves every batch it recorded (no end
    record: it reads as a run that did not finish)."""
    path = tmp_path / "t.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", RECORDER_CHILD, str(path), "61"],
        cwd=ROOT,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    timeline = read_timeline(path)
    assert [s.batch for s in timeline.samples] == list(range(61)) and timeline.end is None
    assert timeline.samples[-1].get("allocated") is None  # batch 60 is not on the stride


def _resident(path: Path) -> int:
    """Bytes of ``path``'s mappings resident in this process (``/proc/self/smaps``)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if not line.split()[0].endswith(":"):  # a mapping's first line: range ... path
            inside = line.endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


def test_the_timeline_never_grows_the_process_resident_memory(tmp_path):
    """Thousands of lines over several windows: the mapped file's resident pages stay within
    one release interval and a page, whatever the count."""
    path = tmp_path / "t.jsonl"
    writer = TimelineWriter(path, HEADER)
    seen = []
    for batch in range(3000):
        writer.write(_sample(batch))
        seen.append(_resident(path) if batch % 100 == 0 else 0)
    writer.close()
    bound = timeline_writer.RELEASED + 2 * mmap.PAGESIZE
    assert 0 < max(seen) <= bound < timeline_writer.WINDOW
    assert path.stat().st_size > 2 * timeline_writer.WINDOW


@pytest.mark.parametrize("where", ["no reservation", "no mapping"])
def test_a_file_system_without_reservations_or_proc_still_gets_every_line(
    tmp_path, monkeypatch, where
):
    """Where ``posix_fallocate`` is not supported the file is extended instead; where the file
    cannot be reopened to be mapped (no ``/proc``), each line is written with ``os.write``."""
    if where == "no reservation":

        def unsupported(fd, offset, length):
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

        monkeypatch.setattr(os, "posix_fallocate", unsupported)
    else:
        monkeypatch.setattr(timeline_writer, "_read_write", lambda fd: None)
    path = tmp_path / "t.jsonl"
    writer = TimelineWriter(path, HEADER)
    for batch in range(1000):
        writer.write(_sample(batch, label="train END" if batch == 500 else "TRAIN_BATCH"))
    writer.close()
    assert not path.read_bytes().endswith(b"\0")
    assert [s.batch for s in read_timeline(path).samples] == list(range(1000))


_VALUES = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text('a%s"')


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.builds(
            Sample,
            label=st.text('ab%"\\é', min_size=1, max_size=4),
            phase=st.sampled_from(["training", "100%", None]),
            epoch=st.none() | st.integers(0, 3),
            batch=st.integers(0, 2**62),
            time=st.floats(0, 2e9),
            metrics=st.dictionaries(
                st.sampled_from(["rss", "peak", "r%", 'q"']),
                st.none() | st.integers(-(2**63), 2**63 - 1),
                max_size=4,
            ),
            note=st.none() | st.text("x%", max_size=3),
            collected=st.booleans(),
        ),
        max_size=12,
    )
)
def test_a_recorders_line_is_the_line_of_every_other_sample(samples):
    """A recorder's sample (its types) has its line built from a kept frame, and a loop's
    batch between two readings (no metric read) from one with its readings' text: the bytes
    are the general encoder's, for any label, phase and set of metric names in any order, the
    same sample twice the same way."""
    line = timeline_writer._LineFormat(schema.FIELDS)
    for sample in samples + samples:
        assert line.recorded(sample) == timeline_writer._any_line(sample)
        unread = dataclasses.replace(sample, metrics=dict.fromkeys(sample.metrics))
        assert line.recorded(unread, unread=True) == timeline_writer._any_line(unread)

"""Which reader reads a timeline: the columnar reader takes every well-formed file."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness._core.errors import BadInput
from harness._core.labels import Raised
from harness._frontends.cli import main
from harness._measure.sample import Sample
from harness._timeline import columns as timeline_columns
from harness._timeline import jsonl as timeline

SCAN = 64
"""The scan block the tests shrink to, so that small files cross many block boundaries."""


def _lines(labels: list[str], pad: int) -> bytes:
    header = {"leakgate_timeline": timeline.FORMAT, "metrics": ["rss"]}
    samples = [
        Sample(label, "training", 0, i, float(i), {"rss": 1000 + i})
        for i, label in enumerate(["p" * (pad + 1), *labels])
    ]
    lines = [json.dumps(header), *(json.dumps(s.to_dict()) for s in samples)]
    lines.append(json.dumps({"leakgate_end": {"error": None}}))
    return ("\n".join(lines) + "\n").encode()


@settings(max_examples=8, deadline=None)
@given(st.lists(st.text("ab", min_size=1, max_size=SCAN), min_size=2, max_size=12))
def test_columns_read_every_line_length_around_a_block_boundary(labels):
    """Lengthening the first sample line by 0 to SCAN - 1 bytes moves every later line end
    over every offset of a scan block, a boundary's 16 bytes of overlap included."""
    with pytest.MonkeyPatch.context() as patch, tempfile.TemporaryDirectory() as folder:
        patch.setattr(timeline_columns, "COLUMNS_FROM", 0)
        patch.setattr(timeline_columns, "SCAN_BLOCK", SCAN)
        path = Path(folder) / "run.jsonl"
        for pad in range(SCAN):
            path.write_bytes(_lines(labels, pad))
            read = timeline.read_timeline(path)
            assert read.reader == "columns", pad
            by_lines = timeline.read_lines(path)
            assert by_lines.reader == "lines"
            assert list(read.samples) == list(by_lines.samples)
            assert (read.header, read.end, read.torn) == (by_lines.header, by_lines.end, 0)


@pytest.mark.parametrize("where", [1, 3])
def test_an_empty_line_goes_to_the_line_reader(tmp_path, monkeypatch, where):
    monkeypatch.setattr(timeline_columns, "COLUMNS_FROM", 0)
    monkeypatch.setattr(timeline_columns, "SCAN_BLOCK", SCAN)
    lines = _lines(["a" * 40] * 6, 0).split(b"\n")
    lines.insert(where, b"")
    path = tmp_path / "run.jsonl"
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(ValueError, match=rf"run.jsonl:{where + 1}: not a JSON line"):
        timeline.read_timeline(path)


def _timeline(path: Path, header: dict, sample: dict) -> Path:
    line = {"label": "TRAIN_BATCH", "phase": "training", "epoch": 0, "batch": 1, "time": 1.0}
    line["metrics"] = {"rss": 1000}
    path.write_text(json.dumps(header) + "\n" + json.dumps({**line, **sample}) + "\n")
    return path


@pytest.mark.parametrize("columns", [True, False], ids=["columns", "lines"])
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("epoch", 2**63),
        ("batch", 2**63),
        ("batch", 2**64 + 1),
        ("epoch", -(2**63)),
        ("batch", -(2**63)),
        ("batch", -(2**63) - 1),
    ],
)
def test_an_epoch_or_batch_beyond_int64_is_bad_input(
    tmp_path, monkeypatch, capsys, columns, field, value
):
    """2**63 and beyond do not fit the store's columns; -2**63 is the store's mark for none."""
    monkeypatch.setattr(timeline_columns, "COLUMNS_FROM", 0 if columns else 1 << 40)
    path = _timeline(tmp_path / "run.jsonl", {"leakgate_timeline": 2}, {field: value})
    with pytest.raises(BadInput) as raised:
        timeline.read_timeline(path)
    assert (raised.value.path, raised.value.line, raised.value.field) == (
        str(path),
        2,
        f"sample.{field}",
    )
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"run.jsonl:2: sample.{field}: expected a whole" in err


@pytest.mark.parametrize("value", [2**63, -(2**63)])
def test_a_reading_beyond_int64_is_bad_input(tmp_path, value):
    path = _timeline(tmp_path / "run.jsonl", {"leakgate_timeline": 2}, {"metrics": {"rss": value}})
    with pytest.raises(BadInput) as raised:
        timeline.read_timeline(path)
    assert (raised.value.line, raised.value.field) == (2, "sample.metrics.rss")


def test_the_largest_whole_numbers_still_read(tmp_path):
    path = _timeline(
        tmp_path / "run.jsonl",
        {"leakgate_timeline": 2},
        {"epoch": 2**63 - 1, "batch": -(2**63) + 1},
    )
    (sample,) = timeline.read_timeline(path).samples
    assert (sample.epoch, sample.batch) == (2**63 - 1, -(2**63) + 1)


@pytest.mark.parametrize("version", [4, 0, "2", 2.0, True, None, [2]])
def test_an_unknown_format_version_is_refused(tmp_path, capsys, version):
    path = _timeline(tmp_path / "run.jsonl", {"leakgate_timeline": version}, {})
    with pytest.raises(BadInput) as raised:
        timeline.read_timeline(path)
    assert (raised.value.line, raised.value.field) == (1, "header.leakgate_timeline")
    capsys.readouterr()
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "leakgate_timeline" in err and "Traceback" not in err


@pytest.mark.parametrize("version", [1, 2, 3])
def test_every_format_version_read_still_loads(tmp_path, version):
    path = _timeline(tmp_path / "run.jsonl", {"leakgate_timeline": version}, {})
    assert [s.label for s in timeline.read_timeline(path).samples] == ["TRAIN_BATCH"]


PARSE = 512
"""The parse block the tests shrink to: larger than any generated line (pyarrow needs that)."""

_samples = st.lists(
    st.builds(
        Sample,
        label=st.text('abé"\\', min_size=1, max_size=40),
        phase=st.sampled_from(["training", "eval", None]),
        epoch=st.none() | st.integers(0, 10**6),
        batch=st.none() | st.integers(-(2**63) + 1, 2**63 - 1),
        time=st.floats(0, 2e9, allow_nan=False),
        metrics=st.fixed_dictionaries(
            {"rss": st.integers(0, 2**62)},
            optional={"anon": st.none() | st.integers(0, 2**40)},
        ),
        collected=st.booleans(),
        note=st.none() | st.text("x\n{}", max_size=12),
    ),
    min_size=1,
    max_size=16,
)


@settings(max_examples=10, deadline=None)
@given(_samples, st.sampled_from(["ended", "killed", "torn"]), st.integers(0, 5000))
def test_columns_read_exactly_the_lines_written(samples, how, zeros):
    """Written as the writer writes them, with both blocks small enough that every file crosses
    many boundaries at every offset (the first line's padding moves them): read in columns,
    the samples written come back, in order, a torn last line skipped and counted, a killed
    writer's reserved zeros read as the end."""
    tail = b'{"label":"cut' if how == "torn" else b""
    if how != "ended":
        tail += b"\0" * zeros  # what a killed writer had reserved
    with pytest.MonkeyPatch.context() as patch, tempfile.TemporaryDirectory() as folder:
        patch.setattr(timeline_columns, "COLUMNS_FROM", 0)
        patch.setattr(timeline_columns, "SCAN_BLOCK", SCAN)
        patch.setattr(timeline_columns, "PARSE_BLOCK", PARSE)
        for pad in range(SCAN):
            written = [Sample("p" * (pad + 1), metrics={"rss": 1}), *samples]
            path = Path(folder) / f"run{pad}.jsonl"
            # a metric met on the way is declared by the end record; a killed run has none, and
            # such a file still goes to the line reader (not covered here)
            declared = ["rss"] if how == "ended" else ["rss", "anon"]
            writer = timeline.TimelineWriter(path, {"metrics": declared})
            for sample in written:
                writer.write(sample)
            if how == "ended":
                writer.end(None, {"metrics": ["anon"]})
            writer.close()
            with path.open("ab") as file:
                file.write(tail)
            read = timeline.read_timeline(path)
            assert read.reader == "columns", pad
            expected = [Sample.from_dict(s.to_dict()) for s in written]
            assert list(read.samples) == expected
            assert read.torn == (how == "torn")
            assert (read.end is not None) == (how == "ended")


OVER = "emulated capacity 1.0MiB exceeded at 'VALIDATION_BATCH': 1.2MiB on cpu"


@pytest.mark.parametrize("version", [1, 2, 3])
def test_an_old_timelines_events_and_edges_are_derived_where_it_is_read(
    tmp_path, monkeypatch, version
):
    """Versions 1 and 2 kept an event in the label or the note, an edge in the label's last
    word, and an error as ``TypeName: message``: both readers derive them. Version 3 writes
    them as fields, so there a note that says the capacity was exceeded is only text."""
    events = [None, "OOM", "OOM", "CHECK_FAILED", None]
    edges = ["START", None, None, None, "END"]
    lines = [
        {"label": "validation START", "phase": "validation"},
        {"label": "VALIDATION_BATCH", "phase": "validation", "batch": 0, "note": OVER},
        {"label": "OOM", "phase": "validation", "batch": 0},
        {"label": "CHECK_FAILED", "phase": "validation", "note": "loss is nan"},
        {"label": "validation END", "phase": "validation"},
    ]
    error: object = "OutOfMemoryError: CUDA out of memory"
    if version == 3:
        events[1] = None  # the note alone
        for line, event, edge in zip(lines, events, edges, strict=True):
            line.update(event=event, edge=edge)
        error = {"type": "OutOfMemoryError", "message": "CUDA out of memory"}
    for line in lines:
        line.update(time=1.0, metrics={"rss": 1}, collected=False)
    header = {"leakgate_timeline": version, "metrics": ["rss"]}
    records = [header, *lines, {"leakgate_end": {"error": error}}]
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    monkeypatch.setattr(timeline_columns, "COLUMNS_FROM", 0)
    by_columns, by_lines = timeline.read_timeline(path), timeline.read_lines(path)
    assert by_columns.reader == "columns"
    for read in (by_columns, by_lines):
        assert [s.event for s in read.samples] == events
        assert [s.edge for s in read.samples] == edges
        assert read.error == Raised("OutOfMemoryError", "CUDA out of memory")

"""One declaration of a sample's fields: a field added there reaches every place."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from harness._core.errors import BadInput
from harness._measure import sample as schema
from harness._measure.sample import Sample, column, fields_of
from harness._rules.sample_columns import Columns
from harness._timeline import columns as timeline_columns
from harness._timeline import jsonl as timeline
from harness._timeline.store import NONE, SampleStore, make_sample


@dataclass(frozen=True)
class _WithWorkers(Sample):
    workers: int | None = field(default=None, metadata=column("int", "bytes workers hold"))


def _samples() -> list[Sample]:
    return [
        make_sample(
            {
                "label": "TRAIN_BATCH",
                "phase": "training",
                "epoch": 0,
                "batch": i,
                "time": 1.5 + i,
                "metrics": {"rss": 1000 + i},
                "collected": False,
                "note": "n" if i == 2 else None,
                "processes": None,
                "event": None,
                "edge": None,
                "workers": None if i % 3 == 0 else 4096 * i,
            }
        )
        for i in range(8)
    ]


@pytest.fixture
def workers(monkeypatch):
    """The declaration with one more field, as one line in a dataclass adds it."""
    monkeypatch.setattr(schema, "FIELDS", fields_of(_WithWorkers))
    return [None if i % 3 == 0 else 4096 * i for i in range(8)]


def test_the_declaration_is_the_samples_fields():
    names = [f.name for f in schema.FIELDS]
    assert names == [
        "label",
        "phase",
        "epoch",
        "batch",
        "time",
        "collected",
        "note",
        "processes",
        "event",
        "edge",
    ]
    assert [f.kind for f in schema.FIELDS] == [
        "text",
        "text",
        "int",
        "int",
        "float",
        "bool",
        "note",
        "text",
        "note",
        "note",
    ]
    assert [f.name for f in schema.FIELDS if f.required] == ["label"]
    assert schema.line_order(schema.FIELDS) == list(Sample("x").to_dict())
    with pytest.raises(TypeError, match="kind"):
        column("decimal", "no such kind")


def test_an_added_field_round_trips_through_store_writer_and_both_readers(
    tmp_path, monkeypatch, workers
):
    samples = _samples()
    store = SampleStore.of(samples)
    assert [s.workers for s in store] == [store[i].workers for i in range(8)] == workers
    assert store.numbers("workers").tolist() == [NONE if w is None else w for w in workers]

    writer = timeline.TimelineWriter(tmp_path / "run.jsonl", {"metrics": ["rss"]})
    for sample in samples:
        writer.write(sample)
    writer.end(None)
    writer.close()
    lines = (tmp_path / "run.jsonl").read_text().splitlines()
    assert [json.loads(line).get("workers") for line in lines[1:-1]] == workers

    monkeypatch.setattr(timeline_columns, "COLUMNS_FROM", 0)
    by_columns = timeline.read_timeline(tmp_path / "run.jsonl")
    by_lines = timeline.read_lines(tmp_path / "run.jsonl")
    assert (by_columns.reader, by_lines.reader) == ("columns", "lines")
    for read in (by_columns, by_lines):
        assert list(read.samples) == samples
        assert [s.workers for s in read.samples] == workers
        columns = Columns(read.samples)
        assert columns.workers.tolist() == [NONE if w is None else w for w in workers]
        assert columns.notes == {2: "n"}


def test_an_added_field_is_checked_by_its_kind(tmp_path, workers):
    path = tmp_path / "run.jsonl"
    line = {"label": "X", "workers": "lots"}
    path.write_text(json.dumps({"leakgate_timeline": 2}) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(BadInput) as raised:
        timeline.read_timeline(path)
    assert (raised.value.line, raised.value.field) == (2, "sample.workers")

"""Which reader reads a timeline: the columnar reader takes every well-formed file."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import timeline
from harness.sample import Sample

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
        patch.setattr(timeline, "COLUMNS_FROM", 0)
        patch.setattr(timeline, "SCAN_BLOCK", SCAN)
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
    monkeypatch.setattr(timeline, "COLUMNS_FROM", 0)
    monkeypatch.setattr(timeline, "SCAN_BLOCK", SCAN)
    lines = _lines(["a" * 40] * 6, 0).split(b"\n")
    lines.insert(where, b"")
    path = tmp_path / "run.jsonl"
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(ValueError, match=rf"run.jsonl:{where + 1}: not a JSON line"):
        timeline.read_timeline(path)

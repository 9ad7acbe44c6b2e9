"""The recorder reads its children: their published live heap where new, smaps_rollup at phase
edges, collected checkpoints and a new process's first, the live processes by role in each
sample, and a timeline that keeps them."""

from __future__ import annotations

import gc
import json
import os

import pytest
from torch.utils.data import DataLoader

from harness._measure.children import SCHEDULE, parse_processes, processes_text
from harness._recorder import Recorder
from harness._timeline import columns as timeline_columns
from harness._timeline.jsonl import read_lines, read_timeline
from harness._verdict.options import Rules

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/self/smaps_rollup"), reason="needs Linux /proc"
)


@pytest.fixture(autouse=True)
def no_workers_of_earlier_tests():
    """Earlier tests' unreferenced loaders shut their workers down first (see test_children)."""
    gc.collect()


def record(tmp_path, **options) -> Recorder:
    """Two epochs of 24 batches from 2 restarted workers, with a collected checkpoint after each."""
    loader = DataLoader(range(24), num_workers=2, multiprocessing_context="fork")
    rec = Recorder("cpu", timeline=tmp_path / "run.jsonl", **options)
    with rec:
        for epoch in range(2):
            with rec.phase("validation", epoch=epoch):
                for batch, _ in enumerate(loader):
                    rec.checkpoint("VALIDATION_BATCH", batch=batch)
                rec.checkpoint("AFTER", collect=True)
        rec.end()
    return rec


def test_children_are_read_at_every_checkpoint_and_rolled_up_at_edges(tmp_path):
    rec = record(tmp_path)
    assert rec.header["children"] == SCHEDULE
    batches = [(i, s) for i, s in enumerate(rec.samples) if s.label == "VALIDATION_BATCH"]
    assert all(s.get("children_heap") for _, s in batches)
    for epoch in (0, 1):
        for role in ("worker 0", "worker 1"):  # each one's live heap, where it was new
            fresh = [s for _, s in batches if s.epoch == epoch and s.get(f"child_heap:{role}")]
            assert 1 <= len(fresh) <= 13  # 12 items a worker, and the reading before its first
    rolled = {i for i, s in enumerate(rec.samples) if s.get("children_uss") is not None}
    edges = {i for i, s in enumerate(rec.samples) if s.label.endswith((" START", " END"))}
    collected = {i for i, s in enumerate(rec.samples) if s.collected}
    alive = {i for i, s in enumerate(rec.samples) if s.processes}
    # the parent rolls up at edges and collected checkpoints, and at a new worker's first
    # checkpoint only when its slot was not yet there; each worker reads its own at its 8th batch
    firsts = {next(i for i, s in batches if s.epoch == e) for e in (0, 1)}
    assert (edges | collected) & alive <= rolled <= (edges | collected | firsts) & alive
    for epoch in (0, 1):
        for role in ("worker 0", "worker 1"):
            own = [s for _, s in batches if s.epoch == epoch and s.get(f"child_uss:{role}")]
            assert own and all(s.get(f"child_shared:{role}") for s in own)
    named = [rec.samples[i] for i in (edges | collected) & alive]
    assert all(s.get("child_heap:worker 0") and s.get("child_heap:worker 1") for s in named)
    # no child alive (the restarted workers exit with each epoch): nothing kept for them
    left = [i for i in range(len(rec.samples)) if i not in alive]
    assert not [
        m for i in left for m, v in rec.samples[i].metrics.items() if v is not None and "child" in m
    ]
    pids = [parse_processes(rec.samples[i].processes) for i in sorted(firsts)]
    assert [set(p) for p in pids] == [{"worker 0", "worker 1"}] * 2
    assert pids[0]["worker 0"] != pids[1]["worker 0"]  # restarted, same role
    for i in rolled:
        s = rec.samples[i]
        assert s.get("children_uss") == sum(
            s.get(f"child_uss:{role}") or 0 for role in parse_processes(s.processes)
        )


def test_a_timeline_keeps_the_children_for_both_readers(tmp_path, monkeypatch):
    rec = record(tmp_path)
    lines = (tmp_path / "run.jsonl").read_text().splitlines()
    end = json.loads(lines[-1])["leakgate_end"]
    assert "child_uss:worker 0" in end["metrics"] and "rss" not in end["metrics"]
    monkeypatch.setattr(timeline_columns, "COLUMNS_FROM", 0)
    by_columns, by_lines = read_timeline(tmp_path / "run.jsonl"), read_lines(tmp_path / "run.jsonl")
    assert (by_columns.reader, by_lines.reader) == ("columns", "lines")
    assert by_columns.samples == by_lines.samples == rec.samples


@pytest.mark.parametrize(
    "options", [{"children": False}, {"rules": Rules(children=False)}], ids=["recorder", "rules"]
)
def test_children_can_be_left_out(tmp_path, options):
    rec = record(tmp_path, **options)
    assert rec.header["children"] is None
    assert not [m for s in rec.samples for m in s.metrics if m.startswith("child")]
    assert {s.processes for s in rec.samples} == {None}


def test_children_takes_a_bool():
    with pytest.raises(TypeError, match="children"):
        Recorder("cpu", children="no")


def test_processes_text_reads_back():
    pids = {"worker 1": 12, "loader 2 worker 0": 13, "python3.11 14": 14}
    text = processes_text(pids)
    assert text == "loader 2 worker 0=13,python3.11 14=14,worker 1=12"
    assert parse_processes(text) == pids
    assert processes_text({}) is None and parse_processes(None) == {}


def test_children_are_read_where_the_probe_is(monkeypatch):
    """Only the checkpoints that read the probe (a loop's batches on its stride) read the
    children, alive or not; the samples between them keep the last reading's live processes
    and no children's metric."""
    with Recorder("cpu") as rec:
        sampler = rec._children
        assert sampler is not None
        calls: list[int] = []
        read = sampler.read
        monkeypatch.setattr(
            sampler, "read", lambda **kw: calls.append(len(rec.samples)) or read(**kw)
        )
        with rec.phase("training", epoch=0):
            for batch in range(64):
                rec.checkpoint("TRAIN_BATCH", batch=batch)
        full = [i for i, s in enumerate(rec.samples) if s.get("allocated") is not None]
        assert calls == full and len(full) < len(rec.samples)
        calls.clear()
        loader = DataLoader(range(64), num_workers=1, multiprocessing_context="fork")
        with rec.phase("validation", epoch=0):
            for batch, _ in enumerate(loader):
                rec.checkpoint("VALIDATION_BATCH", batch=batch)
        looped = [i for i, s in enumerate(rec.samples) if s.label == "VALIDATION_BATCH"]
        full = [i for i, s in enumerate(rec.samples) if s.get("allocated") is not None]
        assert calls == [i for i in full if i > looped[0] - 2] and set(looped) - set(calls)
        between = [rec.samples[i] for i in looped if i not in calls]
        assert (
            {s.processes for s in between}
            == {rec.samples[max(set(calls) & set(looped))].processes}
            != {None}
        )
        assert not [m for s in between for m, v in s.metrics.items() if "child" in m and v]

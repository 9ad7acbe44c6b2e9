"""Long runs: a timeline read in columns, statistics over columns, bytes per checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest

from harness._core import stats
from harness._measure.sample import Sample
from harness._rules.context import Context, Positions
from harness._timeline import columns as timeline_columns
from harness._timeline import jsonl as timeline
from harness._timeline.store import SampleStore
from harness._verdict.options import Rules

METRICS = ("allocated", "rss", "peak")


def _samples(epochs: int, batches: int) -> list[Sample]:
    """A training loop of ``epochs`` x ``batches`` with phase events, a slow leak in epoch 1,
    an OOM event and a note."""
    rng = np.random.default_rng(0)
    out = [Sample("session START", "session", None, None, 0.0, _m(1000, rng), True)]
    for e in range(epochs):
        out.append(Sample("EPOCH_START", "training", e, None, 1.0, _m(1000, rng)))
        for b in range(batches):
            level = 1000 + (300 * b if e == 1 else 0)
            out.append(Sample("TRAIN_BATCH", "training", e, b, 2.0 + b, _m(level, rng)))
            if b % 7 == 0:
                out.append(Sample("AFTER_STEP", "training", e, b, 2.5, _m(level, rng)))
        out.append(Sample("OOM", "training", e, 3, 3.0, _m(1000, rng), note="out of memory"))
        out.append(Sample("EPOCH_END", "training", e, None, 4.0, _m(1000, rng)))
    out.append(Sample("session END", "session", None, None, 5.0, _m(1000, rng), True))
    return out


def _m(level: int, rng: np.random.Generator) -> dict[str, int | None]:
    noise = int(rng.integers(0, 50))
    return {"allocated": level + noise, "rss": 4 * level + noise, "peak": 4 * level + 2 * noise}


def _write(path, samples: list[Sample], end: bool = True) -> None:
    header = {"leakgate_timeline": timeline.FORMAT, "metrics": list(METRICS)}
    lines = [json.dumps(header)] + [json.dumps(s.to_dict()) for s in samples]
    if end:
        lines.append(json.dumps({"leakgate_end": {"error": None}}))
    path.write_text("\n".join(lines) + "\n")


def test_store_costs_under_68_bytes_per_checkpoint_at_scale():
    """Measured: 60.5 bytes per checkpoint, 64.5 with the ``processes`` column (an index into
    the table of distinct texts)."""
    store = SampleStore()
    sample = Sample("TRAIN_BATCH", "training", 0, 0, 1.0, dict.fromkeys(METRICS, 123456789))
    for _ in range(200_000):
        store.append(sample)
    assert store.nbytes() / len(store) < 68


@pytest.fixture(autouse=True)
def _columns_for_small_files(monkeypatch):
    monkeypatch.setattr(timeline_columns, "COLUMNS_FROM", 0)


def test_timeline_read_in_columns_equals_the_line_reader(tmp_path, monkeypatch):
    samples = _samples(3, 40)
    path = tmp_path / "run.jsonl"
    _write(path, samples)
    fast = timeline.read_timeline(path)
    assert isinstance(fast.samples, SampleStore)
    monkeypatch.setattr(timeline_columns, "read_columns", lambda path: None)
    slow = timeline.read_timeline(path)
    assert list(fast.samples) == list(slow.samples) == samples
    assert (fast.header, fast.end, fast.torn) == (slow.header, slow.end, slow.torn)


def test_torn_last_line_and_unusual_lines(tmp_path):
    samples = _samples(1, 10)
    path = tmp_path / "torn.jsonl"
    _write(path, samples, end=False)
    path.write_bytes(path.read_bytes() + b'{"label": "TRAIN_BA')
    torn = timeline.read_timeline(path)
    assert torn.torn == 1 and torn.end is None and list(torn.samples) == samples
    bad = tmp_path / "bad.jsonl"
    _write(bad, samples)
    text = bad.read_text().splitlines()
    text[3] = text[3].replace('"batch": 0', '"batch": true')
    bad.write_text("\n".join(text) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:4: sample.batch"):
        timeline.read_timeline(bad)


@pytest.mark.parametrize("warmup", [0, 5])
def test_context_over_a_store_equals_context_over_a_list(warmup):
    samples = _samples(3, 60)
    rules = Rules(warmup=warmup)
    over_list = Context(samples, rules)
    over_store = Context(SampleStore.of(samples), rules)
    assert len(over_list.groups) == len(over_store.groups) == 3
    for a, b in zip(over_list.groups, over_store.groups, strict=True):
        assert (a.key, a.label, a.metric, a.start, a.end) == (
            b.key,
            b.label,
            b.metric,
            b.start,
            b.end,
        )
        assert a.indices == b.indices and a.series == b.series and a.judged == b.judged
        assert a.fit == b.fit and a.peak == b.peak
    leaking = over_store.groups[1]
    assert leaking.label == "TRAIN_BATCH" and leaking.fit is not None
    assert leaking.fit.trend.slope == pytest.approx(300, rel=0.05)
    assert over_store.loop_positions == over_list.loop_positions
    assert all(s.label != "OOM" for s in (samples[i] for i in over_store.loop_positions))


def test_positions_read_as_a_list_of_ints():
    positions = Positions([3, 5, 8])
    assert positions == [3, 5, 8] and list(positions) == [3, 5, 8]
    assert type(positions[0]) is int and positions[-1] == 8 and positions[1:] == [5, 8]
    assert 5 in positions and 4 not in positions and positions.index(8) == 2
    assert not Positions() and len(positions) == 3


@pytest.mark.parametrize("n", [10, 65536, 300_001])
def test_median_is_numpys(n):
    rng = np.random.default_rng(n)
    for values in (rng.normal(size=n), rng.integers(0, 4, n).astype(float)):
        assert stats.median(values) == float(np.median(values))


@pytest.mark.parametrize("late_metric", [None, 500], ids=["lockstep", "late-metric"])
def test_store_nbytes_is_every_columns_capacity_after_each_append(late_metric):
    """The recorder subtracts ``nbytes`` from every host reading, so the cached figure must be
    exact after each append: columns growing together, a metric first seen late, notes."""
    import sys

    store = SampleStore()
    wrong = []
    for i in range(3000):
        readings = {"allocated": i, "rss": i, "peak": None if i % 7 else i}
        if late_metric is not None and i >= late_metric:
            readings["extra"] = i
        note = "n" if i % 97 == 0 else None
        store.append(Sample("B" if i % 3 else "C", "p", 0, i, 0.0, readings, False, note))
        columns = [*store._columns.values(), *store._metrics.values()]
        full = sum(map(sys.getsizeof, columns)) + sum(map(sys.getsizeof, store._sparse.values()))
        if store.nbytes() != full:
            wrong.append(i)
    assert wrong == []


def _one_phase(batches: int) -> SampleStore:
    """One validation phase of ``batches`` batches between its start and end events."""
    store = SampleStore()
    readings = {"allocated": 1000, "rss": 4000, "peak": 4096}
    store.append(Sample("VALIDATION_START", "validation", 0, None, 0.0, readings))
    for i in range(batches):
        level = 1000 + (i * 7919) % 50 + (30_000 if i == batches // 2 else 0)
        readings = {"allocated": level, "rss": 4 * level, "peak": 4 * level + 96}
        store.append(Sample("VALIDATION_BATCH", "validation", 0, i, 0.0, readings))
    store.append(Sample("VALIDATION_END", "validation", 0, None, 0.0, readings))
    return store


def test_a_long_phase_is_judged_on_views_of_its_positions():
    """A phase of one label is one series: its series and judged batches are views of the
    loop's positions (a million batches cost one array of positions, not one per statistic),
    and positions reach numpy as they are, never as a Python int each."""
    group = Context(_one_phase(3000), Rules(phase=("validation",))).groups[0]
    looped = np.asarray(group.looped)
    assert looped is group.looped.array
    assert np.shares_memory(np.asarray(group.series), looped)
    assert np.shares_memory(np.asarray(group.judged), looped)
    assert len(group.judged) == 3000 - 5 and group.judged[0] == 6


def test_the_peak_is_the_same_whatever_block_it_falls_in(monkeypatch):
    """The peak is found a block of samples at a time; blocks of 7 find the same one (the
    first of the highest) as one block for the whole phase."""
    store = _one_phase(300)
    whole = Context(store, Rules()).groups[0].peak
    monkeypatch.setattr(Context, "_PEAK_BLOCK", 7)
    assert Context(store, Rules()).groups[0].peak == whole
    assert whole is not None and whole.at == 151 and whole.metric == "peak"


def test_a_timeline_read_in_columns_is_judged_on_its_own_columns(tmp_path):
    """A timeline's store takes no more samples, so the statistics read its columns in place
    (read-only) instead of copying each; a recorder's store still hands out copies."""
    samples = _samples(2, 30)
    path = tmp_path / "run.jsonl"
    _write(path, samples)
    store = timeline.read_timeline(path).samples
    assert isinstance(store, SampleStore)
    batch = store.numbers("batch")
    assert not batch.flags.writeable and np.shares_memory(batch, store.numbers("batch"))
    assert not store.metric("rss").flags.writeable and not store.codes("label").flags.writeable
    with pytest.raises(TypeError, match="frozen"):
        store.append(samples[0])
    assert list(store) == samples
    live = SampleStore.of(samples)
    assert live.numbers("batch").flags.writeable
    assert not np.shares_memory(live.numbers("batch"), live.numbers("batch"))

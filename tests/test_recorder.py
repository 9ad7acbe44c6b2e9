import ctypes
import dataclasses
import gc
import json
import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from harness import DeviceOutOfMemory, Recorder, Sample, judge, read_timeline
from harness._core.labels import Raised
from harness._frontends.cli import main
from harness._measure import malloc, probes
from harness._measure.probes import CpuProbe
from harness._measure.sample import STRIDE

MiB = 2**20
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def cuda(test):
    """Mark ``test`` as a CUDA test (``-m cuda``), skipped without a GPU."""
    return pytest.mark.cuda(needs_gpu(test))


ROOT = Path(__file__).resolve().parents[1]


def filled(nbytes: int, device: str = "cpu") -> torch.Tensor:
    """A float32 tensor of ``nbytes`` whose pages are written, hence resident."""
    return torch.ones(nbytes // 4, device=device)


def growth(samples: list[Sample], metric: str) -> int:
    return samples[-1].get(metric) - samples[0].get(metric)


@pytest.fixture
def holed_heap():
    """malloc's heap with a free, trimmed hole of 75 MiB below a block in use, as earlier tests
    in the process may leave one: a large temporary is then served from the hole, made
    resident, and stays resident when freed, until the heap is trimmed again."""
    make = malloc.libc_function("malloc", ctypes.c_void_p, ctypes.c_size_t)
    free = malloc.libc_function("free", None, ctypes.c_void_p)
    free(make(30 * MiB))  # an mmapped block freed raises glibc's mmap threshold above 25 MiB
    blocks = [make(25 * MiB) for _ in range(3)]
    pin = make(MiB)
    for block in blocks:
        free(block)
    malloc.libc_function("malloc_trim", ctypes.c_int, ctypes.c_size_t)(0)
    yield
    free(pin)


@pytest.fixture
def rec():
    """A recorder over a trimmed heap: a resident hole that earlier tests left in malloc's heap
    would take a temporary without moving ``rss`` or its high-water mark."""
    with Recorder("cpu") as recorder:
        recorder.probe.release()
        yield recorder


def test_held_tensor_shows_in_allocated_and_rss(rec):
    rec.checkpoint("warm-up")
    before = rec.checkpoint("before")
    tensor = filled(64 * MiB)
    held = rec.checkpoint("held")
    for metric in ("allocated", "rss"):
        assert held.get(metric) - before.get(metric) == pytest.approx(64 * MiB, rel=0.1)
    del tensor


def test_freed_temporary_shows_in_peak_not_in_rss_once_collected(holed_heap, rec):
    before = rec.checkpoint("before")
    temporary = filled(64 * MiB)
    del temporary
    after = rec.checkpoint("after", collect=True)
    assert after.get("peak") - before.get("rss") == pytest.approx(64 * MiB, rel=0.1)
    assert abs(after.get("rss") - before.get("rss")) < 6 * MiB
    assert rec.checkpoint("next").get("peak") - after.get("rss") < 6 * MiB


def leak_per_epoch(rec: Recorder, *, collect: bool, epochs: int = 2) -> list[list[Sample]]:
    """176 batches that each keep ~300 KB until their epoch ends (the malloc-reuse trap)."""
    per_epoch = []
    for epoch in range(epochs):
        kept = []
        with rec.phase("train", epoch=epoch, collect=collect):
            for batch in range(176):
                kept.append(filled(300_000))
                if batch in (0, 175):
                    rec.checkpoint("TRAIN_BATCH", batch=batch, collect=collect)
        per_epoch.append([s for s in rec.samples if s.epoch == epoch and s.batch is not None])
        del kept
    return per_epoch


EXPECTED_GROWTH = 175 * 300_000


def test_refilled_leak_grows_allocated_in_every_epoch(rec):
    for samples in leak_per_epoch(rec, collect=False):
        assert growth(samples, "allocated") == pytest.approx(EXPECTED_GROWTH, rel=0.1)


def test_refilled_leak_grows_rss_in_every_epoch_with_collect(rec):
    for samples in leak_per_epoch(rec, collect=True):
        assert growth(samples, "allocated") == pytest.approx(EXPECTED_GROWTH, rel=0.1)
        assert growth(samples, "rss") == pytest.approx(EXPECTED_GROWTH, rel=0.1)


def test_without_mallinfo2_rss_is_primary_and_follows_the_refilled_leak(
    monkeypatch, fresh_allocator
):
    monkeypatch.setattr(
        malloc, "_LIBC", types.SimpleNamespace(malloc_trim=malloc._LIBC.malloc_trim)
    )
    with Recorder("cpu") as rec:
        assert rec.probe.primary == "rss"
        for samples in leak_per_epoch(rec, collect=False):
            assert growth(samples, "rss") == pytest.approx(EXPECTED_GROWTH, rel=0.1)
            assert samples[0].get("allocated") is None


def test_phases_tag_samples(rec):
    rec.checkpoint("SESSION_START")
    with rec.phase("epoch", epoch=2):
        rec.checkpoint("EPOCH_START")
        with rec.phase("validation"):
            rec(
                "VALIDATION_BATCH",
                phase="validation",
                epoch=None,
                batch=7,
                note="batch note",
            )
            rec.checkpoint("OWN_TAGS", phase="other", epoch=9)
    rec.checkpoint("SESSION_END")
    assert [(s.label, s.phase, s.epoch, s.batch) for s in rec.samples] == [
        ("SESSION_START", None, None, None),
        ("epoch START", "epoch", 2, None),
        ("EPOCH_START", "epoch", 2, None),
        ("validation START", "validation", 2, None),
        ("VALIDATION_BATCH", "validation", 2, 7),
        ("OWN_TAGS", "other", 9, None),
        ("validation END", "validation", 2, None),
        ("epoch END", "epoch", 2, None),
        ("SESSION_END", None, None, None),
    ]
    assert rec.samples[4].note == "batch note"


def test_phase_end_is_recorded_when_the_block_raises(rec):
    with pytest.raises(KeyError), rec.phase("validation", epoch=0):
        raise KeyError("boom")
    end = rec.samples[-1]
    assert (end.label, end.phase, end.note) == (
        "validation END",
        "validation",
        "phase ended by KeyError",
    )
    assert rec.checkpoint("after").phase is None


def test_collect_frees_cycles_and_the_freeze_is_undone_on_close():
    gc.disable()
    try:
        with Recorder("cpu") as rec:
            assert gc.get_freeze_count() > 0
            node = types.SimpleNamespace(data=filled(64 * MiB))
            node.self = node
            rec.checkpoint("held")
            del node
            plain = rec.checkpoint("plain")
            collected = rec.checkpoint("collected", collect=True)
        freed = plain.get("allocated") - collected.get("allocated")
        assert freed == pytest.approx(64 * MiB, rel=0.1)
        assert collected.collected and not plain.collected
        assert gc.get_freeze_count() == 0
    finally:
        gc.enable()


def test_nested_recorders_leave_the_freeze_to_the_first():
    with Recorder("cpu"):
        inner = Recorder("cpu")
        inner.close()
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


@dataclasses.dataclass
class RunConfig:
    batch_size: int = 1
    parquet: Path = Path("bars.parquet")


def test_timeline_streams_header_and_samples(tmp_path):
    path = tmp_path / "run" / "timeline.jsonl"
    with Recorder("cpu", timeline=path, config=RunConfig(), meta={"test": "t"}) as rec:
        header = json.loads(path.read_text())
        rec.checkpoint("A", batch=1)
        assert len(read_timeline(path).samples) == 1
        with rec.phase("validation", epoch=0):
            rec("OOM", note="out of memory")
    assert header["config"] == {"batch_size": 1, "parquet": "bars.parquet"}
    assert header["meta"] == {"test": "t"}
    assert header["probe"] == "cpu" and header["primary"] == "allocated"
    assert header["torch"] == torch.__version__ and header["notes"] == []
    assert header["total_memory"] == header["capacity"] > 0
    assert header["capacity_metric"] == CpuProbe.capacity_metric == "rss"
    for key in ("leakgate", "device", "driver", "host", "git_commit", "started"):
        assert key in header
    timeline = read_timeline(path)
    assert timeline.header == header
    assert timeline.samples == rec.samples and timeline.torn == 0


def test_closed_recorder_refuses_checkpoints(tmp_path):
    rec = Recorder("cpu", timeline=tmp_path / "t.jsonl")
    rec.close()
    rec.close()
    with pytest.raises(RuntimeError, match="closed"):
        rec.checkpoint("late")


def test_a_recorder_closed_by_hand_ends_cleanly_and_only_a_stopped_one_reads_as_a_crash(
    tmp_path, capsys
):
    path = tmp_path / "t.jsonl"
    rec = Recorder("cpu", timeline=path)
    for batch in range(30):
        rec.checkpoint("TRAIN_BATCH", phase="training", epoch=0, batch=batch)
    assert main(["report", str(path), "-o", str(tmp_path / "live.md")]) == 1  # still running
    assert "killed or crashed" in json.loads((tmp_path / "live.json").read_text())["error"]
    rec.close()
    assert read_timeline(path).end["error"] is None
    capsys.readouterr()
    assert main(["report", str(path)]) == 0
    assert capsys.readouterr().out.startswith("PASS: 0 findings")
    assert json.loads((tmp_path / "t.json").read_text())["error"] is None


def test_a_with_block_that_raises_ends_the_run_with_its_error(tmp_path):
    path = tmp_path / "t.jsonl"
    with pytest.raises(KeyError), Recorder("cpu", timeline=path) as rec:
        rec.checkpoint("A")
        raise KeyError("batch")
    timeline = read_timeline(path)
    assert timeline.end["error"] == {"type": "KeyError", "message": "'batch'"}
    assert timeline.error == Raised("KeyError", "'batch'")
    assert str(timeline.error) == "KeyError: 'batch'"


def test_a_note_is_text_and_the_event_a_fact(tmp_path):
    """A note that says the capacity was exceeded makes no OOM; the label ``OOM`` or
    ``event="OOM"`` does, and so does the recorder's own emulated capacity (below)."""
    path = tmp_path / "t.jsonl"
    with Recorder("cpu", timeline=path) as rec:
        rec.checkpoint("VALIDATION_BATCH", phase="validation", batch=0, note="capacity exceeded")
    (said,) = read_timeline(path).samples
    assert said.event is None and not judge(read_timeline(path).samples).findings
    with Recorder("cpu", timeline=path) as rec:
        rec.checkpoint("VALIDATION_BATCH", phase="validation", batch=0, event="OOM")
        rec.checkpoint("oom", phase="validation", batch=0)
        rec.checkpoint("CHECK_FAILED", phase="validation", note="loss is nan")
        with pytest.raises(TypeError, match="checkpoint event"):
            rec.checkpoint("VALIDATION_BATCH", event="out of memory")
    assert [s.event for s in read_timeline(path).samples] == ["OOM", "OOM", "CHECK_FAILED"]


def test_the_recorder_says_where_a_phase_starts_and_ends(tmp_path):
    path = tmp_path / "t.jsonl"
    with Recorder("cpu", timeline=path) as rec:
        with rec.phase("validation"):
            rec.checkpoint("VALIDATION_BATCH", batch=0)
        rec.checkpoint("TRAIN_START")
        rec.checkpoint("EPOCH_END")
    edges = [(s.label, s.edge) for s in read_timeline(path).samples]
    assert edges == [
        ("validation START", "START"),
        ("VALIDATION_BATCH", None),
        ("validation END", "END"),
        ("TRAIN_START", "START"),
        ("EPOCH_END", "END"),
    ]


def test_fallbacks_are_noted_once_in_the_header(monkeypatch, tmp_path, fresh_allocator):
    monkeypatch.setattr(malloc, "_LIBC", None)
    monkeypatch.setattr(probes, "_CLEAR_REFS", str(tmp_path))
    path = tmp_path / "t.jsonl"
    with Recorder("cpu", timeline=path) as rec:
        for batch in range(3):
            rec.checkpoint("TRAIN_BATCH", batch=batch)
    timeline = read_timeline(path)
    notes = timeline.header["notes"]
    assert [n.split(":")[0] for n in notes] == [
        "cpu allocated unavailable",
        "cpu malloc_trim unavailable",
        "cpu peak unavailable",
        "children read from outside",
    ]
    assert timeline.header["primary"] == "rss"
    for sample in timeline.samples:
        assert sample.get("allocated") is None and sample.get("peak") is None
        assert sample.get("rss") > 0 and sample.note is None


class FlakyProbe(CpuProbe):
    """Loses a source at its second reading."""

    def sample(self):
        self.readings = getattr(self, "readings", 0) + 1
        if self.readings == 2:
            self.notes.append("source lost")
        return super().sample()


def test_a_source_lost_mid_run_is_noted_on_the_next_sample():
    with Recorder(FlakyProbe()) as rec:
        notes = [rec.checkpoint("x", note=n).note for n in (None, "event", None)]
    assert notes == [None, "event; source lost", None]


def test_killed_run_leaves_a_parseable_timeline(tmp_path):
    path = tmp_path / "killed.jsonl"
    child = """
import os, signal, sys, threading
from harness import Recorder

rec = Recorder("cpu", timeline=sys.argv[1], config={"pad": "x" * 5000})
started = threading.Event()
threading.Thread(target=lambda: started.wait() and os.kill(os.getpid(), signal.SIGKILL)).start()
batch = 0
while True:
    rec.checkpoint("TRAIN_BATCH", phase="train", batch=batch, note="n" * (batch % 3000))
    batch += 1
    if batch == 200:
        started.set()
"""
    done = subprocess.run([sys.executable, "-c", child, str(path)], cwd=ROOT, timeout=120)
    assert done.returncode == -signal.SIGKILL
    data = path.read_bytes().rstrip(b"\0")  # the space the writer had reserved
    complete = data[: data.rindex(b"\n")].split(b"\n")
    for line in complete:
        json.loads(line)
    timeline = read_timeline(path)
    assert len(timeline.samples) == len(complete) - 1 >= 200
    assert [s.batch for s in timeline.samples] == list(range(len(timeline.samples)))
    assert timeline.torn == (not data.endswith(b"\n"))


def test_reader_skips_a_torn_last_line_at_any_cut(tmp_path):
    path = tmp_path / "t.jsonl"
    with Recorder("cpu", timeline=path) as rec:
        for batch in range(2):
            rec.checkpoint("TRAIN_BATCH", batch=batch, note="é")
    data = path.read_bytes()
    data = data[: data.rindex(b"\n", 0, -1) + 1]  # the end record off: a run cut short
    ends = [i + 1 for i, byte in enumerate(data) if byte == ord("\n")]
    cut_path = tmp_path / "cut.jsonl"
    for cut in range(ends[0], len(data) + 1):
        cut_path.write_bytes(data[:cut])
        timeline = read_timeline(cut_path)
        unterminated = cut + 1 in ends
        lines = sum(end <= cut for end in ends) + unterminated
        torn = int(cut not in ends and not unterminated)
        assert (len(timeline.samples), timeline.torn) == (lines - 1, torn)
        assert timeline.samples == rec.samples[: lines - 1]


def test_reader_rejects_damage_before_the_last_line(tmp_path):
    path = tmp_path / "t.jsonl"
    with Recorder("cpu", timeline=path) as rec:
        rec.checkpoint("A")
        rec.checkpoint("B")
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + lines[1][:10] + "\n" + lines[2])
    with pytest.raises(ValueError, match=":2: not a JSON line"):
        read_timeline(path)
    path.write_text(lines[1])
    with pytest.raises(ValueError, match="no header"):
        read_timeline(path)
    path.write_text("")
    with pytest.raises(ValueError, match="no header"):
        read_timeline(path)


def resident_now() -> int:
    probe = CpuProbe()
    try:
        return probe.sample()["rss"]
    finally:
        probe.close()


def test_emulated_capacity_raises_at_the_first_checkpoint_over_it(holed_heap, tmp_path):
    path = tmp_path / "t.jsonl"
    capacity = resident_now() + 100 * MiB
    kept = []
    with Recorder("cpu", capacity=capacity, timeline=path) as rec:
        rec.checkpoint("start")
        for held in (40, 80):
            kept.append(filled(40 * MiB))
            rec.checkpoint(f"{held} MiB")
        kept.append(filled(40 * MiB))
        with pytest.raises(DeviceOutOfMemory, match="emulated capacity") as raised:
            rec.checkpoint("120 MiB")
        assert isinstance(raised.value, torch.OutOfMemoryError)
        assert raised.value.sample == rec.samples[-1]
        assert rec.samples[-1].note == str(raised.value)
        assert rec.samples[-1].event == "OOM"
        assert rec("OOM", note="handled").note == "handled"
        with pytest.raises(DeviceOutOfMemory):
            rec.checkpoint("retry, 120 MiB")
        kept.clear()
        rec.checkpoint("freed", collect=True)
        kept.append(filled(120 * MiB))
        with pytest.raises(DeviceOutOfMemory):
            rec.checkpoint("120 MiB again")
    labels = [s.label for s in read_timeline(path).samples]
    assert labels == [
        "start",
        "40 MiB",
        "80 MiB",
        "120 MiB",
        "OOM",
        "retry, 120 MiB",
        "freed",
        "120 MiB again",
    ]


def test_emulated_capacity_counts_the_peak_between_checkpoints():
    with Recorder("cpu", capacity=resident_now() + 100 * MiB) as rec:
        rec.checkpoint("start")
        temporary = filled(150 * MiB)
        del temporary
        with pytest.raises(DeviceOutOfMemory, match="'spike'"):
            rec.checkpoint("spike")
        rec.checkpoint("quiet")


def test_a_phase_ended_by_an_oom_records_its_end_without_raising_again():
    kept = []
    with Recorder("cpu", capacity=resident_now() + 100 * MiB) as rec:
        with pytest.raises(DeviceOutOfMemory), rec.phase("validation", epoch=0):
            kept.append(filled(150 * MiB))
            rec.checkpoint("VALIDATION_BATCH", batch=0)
        end = rec.samples[-1]
        assert (end.label, end.note) == ("validation END", "phase ended by DeviceOutOfMemory")
        assert end.get("rss") > rec.capacity


@pytest.mark.parametrize(
    ("size", "nbytes"),
    [("4 GB", 4 * 10**9), ("512KiB", 512 * 2**10), ("50MB", 50 * 10**6), (4096, 4096)],
)
def test_capacity_sizes(size, nbytes):
    with Recorder("cpu", capacity=size) as rec:
        assert rec.capacity == nbytes and rec.header["capacity_emulated"]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"probe": "gpu"}, ValueError, "unknown probe"),
        ({"capacity": "abc"}, ValueError, "capacity: cannot read 'abc'"),
        ({"capacity": -1}, ValueError, "capacity: must not be negative"),
        ({"capacity": "-4GB"}, ValueError, "capacity"),
        ({"capacity": True}, ValueError, "capacity"),
        ({"config": ["batch_size", 1]}, TypeError, "config: expected a mapping"),
    ],
)
def test_bad_input_fails_before_any_file_exists(tmp_path, kwargs, error, match):
    path = tmp_path / "t.jsonl"
    with pytest.raises(error, match=match):
        Recorder(timeline=path, **kwargs)
    assert not path.exists()


def test_unwritable_timeline_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    for path in (blocker / "t.jsonl", tmp_path):
        with pytest.raises(OSError, match="cannot write the timeline") as raised:
            Recorder("cpu", timeline=path)
        assert str(path) in str(raised.value)
    assert blocker.read_text() == "" and gc.get_freeze_count() == 0


@cuda
def test_cuda_recorder_collects_and_emulates_capacity_with_a_real_oom(tmp_path):
    torch.cuda.empty_cache()
    capacity = torch.cuda.memory_reserved(0) + 256 * MiB
    with Recorder("cuda:0", capacity=capacity, timeline=tmp_path / "t.jsonl") as rec:
        tensor = filled(128 * MiB, "cuda")
        del tensor
        assert rec.checkpoint("cached").get("reserved") >= 128 * MiB
        collected = rec.checkpoint("collected", collect=True)
        assert collected.get("reserved") == capacity - 256 * MiB
        with pytest.raises(torch.OutOfMemoryError):
            filled(512 * MiB, "cuda")
    header = read_timeline(tmp_path / "t.jsonl").header
    assert header["capacity"] == capacity and header["capacity_emulated"]
    assert header["total_memory"] == torch.cuda.get_device_properties(0).total_memory
    assert torch.cuda.get_per_process_memory_fraction(0) == 1.0


def test_a_loops_batches_between_readings_are_in_the_store_and_in_the_file_by_the_next_line(
    tmp_path,
):
    """The batches between two stride readings take a short path: each returned sample is the
    store's at once, and the timeline's with the next line written (read back while the run
    lives: the file holds every reading as it comes, and the unread batches before it), phase
    and epoch inherited, nothing read, whatever the label's text."""
    path = tmp_path / "t.jsonl"
    returned = []
    with Recorder("cpu", timeline=path) as rec:
        for epoch in (None, 3):
            with rec.phase("val 100%", epoch=epoch):
                for batch in range(60):
                    returned.append(rec.checkpoint('BATCH "50%" é', batch=batch))
                    assert len(rec.samples) == len(returned) + 1 + 2 * (epoch == 3)
                    live = read_timeline(path).samples
                    read = [s for s in returned if s.get("allocated") is not None]
                    assert live[-1] == read[-1] and live[-1].time == read[-1].time
                    assert live == list(rec.samples)[: len(live)]
                    assert len(live) == len(rec.samples) - (returned[-1].batch - read[-1].batch)
        assert list(rec.samples) == read_timeline(path).samples
    unread = [s for s in returned if s.get("allocated") is None]
    between = [b for b in range(STRIDE.first + 1, 60) if b % STRIDE.every]
    assert [s.batch for s in unread] == between * 2
    assert {(s.phase, s.epoch, s.note, s.processes, s.event, s.edge) for s in unread} == {
        ("val 100%", None, None, None, None, None),
        ("val 100%", 3, None, None, None, None),
    }
    assert all(s.metrics == dict.fromkeys(CpuProbe.metrics) for s in unread)
    assert list(rec.samples) == read_timeline(path).samples


def test_a_probe_that_reads_some_metrics_between_stride_readings_keeps_them(tmp_path):
    """Only a probe that reads nothing between two stride readings has its loop's batches
    recorded on the short path; one that strides ``allocated`` alone keeps ``rss`` and
    ``peak`` at every batch, in the store and in the timeline."""
    probe = CpuProbe()
    probe.strided = ("allocated",)
    probe.sample_between = lambda: {**probe.sample(), "allocated": None}
    with Recorder(probe, timeline=tmp_path / "t.jsonl") as rec:
        for batch in range(48):
            rec.checkpoint("TRAIN_BATCH", batch=batch)
    between = [s for s in rec.samples if s.batch > STRIDE.first and s.batch % STRIDE.every]
    assert between and all(s.get("allocated") is None and s.get("rss") for s in between)
    assert list(rec.samples) == read_timeline(tmp_path / "t.jsonl").samples


@pytest.mark.parametrize("leak", [0, 4096])
def test_a_long_loop_reads_memory_on_a_stride_and_is_judged_on_what_was_read(leak):
    """mallinfo2 walks malloc's free lists (67 µs a checkpoint inside a TFT epoch), so a loop
    reads the CPU's memory at each of a label's first 32 batches, then at every 16th, and at
    every checkpoint that is not a batch's; the leak rule fits the batches read and says
    which, and the peak between two readings is the next one's (its window is reset only
    when read)."""
    from harness import judge
    from harness._verdict.options import Rules

    kept = []
    with Recorder("cpu") as rec:
        rec.probe.release()  # no resident hole in the heap for the spike to take
        for epoch in range(2):
            with rec.phase("validation", epoch=epoch):
                for batch in range(200):
                    kept.append(torch.ones(leak // 4 + 1))
                    if batch == 101:
                        filled(64 * MiB).sum()  # a spike between two readings, freed
                    rec.checkpoint("VALIDATION_BATCH", batch=batch)
                    if batch % 50 == 0:
                        rec.checkpoint("AFTER_STEP", batch=batch)
        verdict = judge(rec.samples, Rules(phase="validation", max_growth="128KiB"))
    assert rec.header["stride"] == {
        "metrics": list(CpuProbe.metrics),
        "first": 32,
        "every": 16,
    }
    batches = [s for s in rec.samples if s.label == "VALIDATION_BATCH"]
    expected = [*range(32), *range(32, 200, 16)]
    for metric in ("allocated", "rss", "peak"):
        assert [s.batch for s in batches if s.get(metric)] == expected * 2
    others = [s for s in rec.samples if s.label != "VALIDATION_BATCH"]
    assert all(s.get("allocated") and s.get("rss") for s in others)
    before, after = (next(s for s in batches if s.batch == b) for b in (96, 112))
    assert after.get("peak") - before.get("rss") > 48 * MiB
    stats = [p for p in verdict.phases if p.phase == "validation"]
    assert [(p.metric, p.batches, p.judged) for p in stats] == [
        ("allocated", 200, len(expected) - 5)
    ] * 2
    checks = [c for c in verdict.checks if c.rule == "max_growth"]
    assert all(f"read at {len(expected)} of 200 batches" in c.details for c in checks)
    assert {c.details.split(" read at")[0].split(" (")[-1] for c in checks} == {
        "allocated",
        "outside",  # judged beside it, on the same readings
    }
    assert [f.kind for f in verdict.findings] == (["leak"] if leak else [])

"""The whole job's memory: a leak fails wherever the job keeps it (malloc, Python's own
allocator, a library's pool, a mapping no counter reads, the processes it starts, the host
beside a device), with the part that grew named, and its clean twin passes. Run through the
plugin as a user runs it, each case's growth held against the truth measured another way
inside the test itself, in an unrecorded pass of the same loop: the process's resident
anonymous memory after a collection and a trim (``/proc``) for tensors, tracemalloc for Python
objects (each allocation as the allocator serves it), pyarrow's own counter for its pool, and
the children's private memory (``smaps_rollup``) for processes."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest
import torch

from harness._measure.probes import Probe
from harness._recorder import Recorder
from harness._results.finish import finish_run
from harness._verdict.model import Kind
from harness._verdict.options import Rules

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/self/smaps_rollup") or sys.platform != "linux",
    reason="needs Linux /proc and glibc",
)

TRUTH = '''
import ctypes
import gc
import json
import os
import tracemalloc

_LIBC = ctypes.CDLL(None)


def allotted(size):
    """What serving ``size`` bytes takes: a block of Python's allocator (16-byte steps up to
    512 B), else a malloc chunk (an 8-byte header, 16-byte steps)."""
    return (size + 15) // 16 * 16 if size <= 512 else (size + 8 + 15) // 16 * 16


def traced():
    """What the test's own lines hold, as tracemalloc traces it, each allocation as the
    allocator serves it (tracemalloc counts what was asked: 24 B for a float in a 32 B
    block). Starts tracing on its first call."""
    if not tracemalloc.is_tracing():
        tracemalloc.start()
    snapshot = tracemalloc.take_snapshot()
    mine = snapshot.filter_traces([tracemalloc.Filter(True, "*test_shapes.py")])
    return sum(allotted(trace.size) for trace in mine.traces)


def anon():
    """RssAnon after a collection and a trim: what the process really holds, read by /proc."""
    gc.collect()
    _LIBC.malloc_trim(0)
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("RssAnon:"))
    return int(line.split()[1]) * 1024


def children_private():
    """The private memory of every live child (smaps_rollup), and their count."""
    total, count = 0, 0
    for task in os.listdir(f"/proc/{os.getpid()}/task"):
        with open(f"/proc/{os.getpid()}/task/{task}/children") as listed:
            for pid in listed.read().split():
                try:
                    with open(f"/proc/{pid}/smaps_rollup") as rollup:
                        total += sum(int(line.split()[1]) * 1024 for line in rollup
                                     if line.startswith(("Private_Clean:", "Private_Dirty:")))
                    count += 1
                except OSError:
                    pass
    return total, count


def keep_truth(name, grown):
    with open(f"truth-{name}.json", "w") as out:
        json.dump(grown, out)
'''

SHAPES = '''
import multiprocessing
import tracemalloc

import pyarrow as pa
import pytest
import torch
from torch import nn

from truth import anon, children_private, keep_truth, traced

BATCHES, WARMUP = 176, 5
LOOP = dict(phase="validation", max_growth="4MB", warmup=WARMUP)


def validate(memtrace, keep, reset, name, truth=anon):
    """A validation loop whose batch outputs ``keep`` is given, run twice: first unrecorded,
    the truth of what it kept from the end of warm-up to its end kept for the test that runs
    this one (leakgate's own memory, which it leaves out, is not in the truth), then, after
    ``reset``, recorded."""
    torch.manual_seed(0)
    net = nn.Linear(64, 1024)
    with torch.no_grad():
        for batch in range(BATCHES):
            if batch == WARMUP:
                start = truth()
            keep(batch, net(torch.randn(1, 64))[0])
        keep_truth(name, truth() - start)
        reset()
        tracemalloc.stop()
        with memtrace.phase("validation", epoch=0):
            for batch in range(BATCHES):
                keep(batch, net(torch.randn(1, 64))[0])
                memtrace.checkpoint("VALIDATION_BATCH", batch=batch)


@pytest.mark.memleak(**LOOP)
@pytest.mark.parametrize("leak", [True, False], ids=["leak", "clean"])
def test_tensors(memtrace, leak):
    kept = []

    def keep(batch, out):
        kept.append(out.repeat(9).clone())  # 36 KiB a batch: about 1.5x the budget in all
        if not leak:
            kept.clear()

    validate(memtrace, keep, kept.clear, f"tensors-{leak}")


@pytest.mark.memleak(**LOOP)
@pytest.mark.parametrize("leak", [True, False], ids=["leak", "clean"])
def test_python_floats(memtrace, leak):
    scores = []

    def keep(batch, out):
        if not leak:
            scores.clear()
        scores.extend(out[:900].tolist())

    validate(memtrace, keep, scores.clear, f"floats-{leak}", truth=traced)


@pytest.mark.memleak(**LOOP)
@pytest.mark.parametrize("leak", [True, False], ids=["leak", "clean"])
def test_short_strings_in_a_dict(memtrace, leak):
    seen = {}

    def keep(batch, out):
        if not leak:
            seen.clear()
        for i in range(170):
            seen[f"request-{batch:06d}-{i:06d}-" + "x" * 36] = (batch, i)

    validate(memtrace, keep, seen.clear, f"strings-{leak}", truth=traced)


@pytest.mark.memleak(**LOOP)
@pytest.mark.parametrize("leak", [True, False], ids=["leak", "clean"])
def test_pyarrow_buffers(memtrace, leak):
    table = None

    def keep(batch, out):
        nonlocal table
        values = out.tolist()
        part = pa.table({f"c{k}": pa.array(values, pa.float64()) for k in range(4)})
        table = pa.concat_tables([table, part]) if leak and table is not None else part

    def reset():
        nonlocal table
        table = None

    validate(memtrace, keep, reset, f"pyarrow-{leak}", truth=pa.total_allocated_bytes)


def square(x):
    return x * x


@pytest.mark.memleak(phase="train", max_growth="4MB", warmup=WARMUP, max_drift="4MB")
@pytest.mark.parametrize("leak", [True, False], ids=["leak", "clean"])
def test_one_more_process_each_epoch(memtrace, leak):
    """A pool made each epoch and never closed (or, clean, one pool made once and kept)."""
    context = multiprocessing.get_context("fork")
    pools, private = [], {}
    for epoch in range(4):
        with memtrace.phase("train", epoch=epoch):
            if leak or not pools:
                pools.append(context.Pool(1))
            pools[-1].map(square, range(4))
            for batch in range(20):
                memtrace.checkpoint("TRAIN_BATCH", batch=batch)
        private[epoch] = children_private()[0]
    keep_truth(f"processes-{leak}", private[3] - private[1])
    for pool in pools:
        pool.close()
        pool.join()
'''


def _verdicts(pytester: pytest.Pytester) -> dict[str, dict]:
    """Each saved verdict by its test's name and parameters (``test_x[leak]`` saved as
    ``test_x_leak``)."""
    found = {}
    for path in (pytester.path / "out").glob("*.json"):
        if "__" in path.name:
            name = path.name.split("__")[1].rsplit("-", 1)[0]
            found[name] = json.loads(path.read_text())
    return found


def _verdict(verdicts: dict[str, dict], test: str) -> dict:
    return verdicts[re.sub(r"[^A-Za-z0-9_-]+", "_", test).strip("_")]


def _truth(pytester: pytest.Pytester, name: str) -> int:
    return json.loads((pytester.path / f"truth-{name}.json").read_text())


GROWN = {
    "tensors": ("leak", r"leak in validation epoch 0: .*malloc \+"),
    "floats": ("leak", r"leak in validation epoch 0: .*: Python objects \+[\d.]+MiB"),
    "strings": ("leak", r"leak in validation epoch 0: .*: Python objects \+[\d.]+MiB"),
    "pyarrow": ("leak", r"leak in validation epoch 0: .*: pyarrow pool \+[\d.]+MiB"),
    "processes": (
        "drift",
        r"drift of the job's memory at train \w+: .*children \+[\d.]+MiB.*"
        r"\d child processes alive at epoch 3 against \d at epoch 1 \(1 more each epoch\)",
    ),
}
"""Each shape's finding kind and what its message names as the part that grew."""


def test_the_same_leak_held_in_each_place_memory_lives_gets_the_same_verdict(pytester):
    """Metamorphic: about 1.5x the budget kept as tensors, Python floats, short strings in a
    dict, pyarrow buffers and one more process each epoch all FAIL, each naming the part that
    grew, with a growth within 20% of the truth; each clean twin PASSes."""
    pytester.makepyfile(truth=TRUTH, test_shapes=SHAPES)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "--memreport=out", "-rA")
    text = result.stdout.str()
    result.assert_outcomes(passed=5, failed=5)
    verdicts = _verdicts(pytester)
    tests = {
        "tensors": "test_tensors",
        "floats": "test_python_floats",
        "strings": "test_short_strings_in_a_dict",
        "pyarrow": "test_pyarrow_buffers",
        "processes": "test_one_more_process_each_epoch",
    }
    for shape, test in tests.items():
        assert f"PASSED test_shapes.py::{test}[clean]" in text, (shape, text)
        verdict = _verdict(verdicts, f"{test}[leak]")
        assert verdict["status"] == "FAIL", (shape, verdict)
        kind, named = GROWN[shape]
        (finding,) = [f for f in verdict["findings"] if f["kind"] == kind]
        assert re.search(named, finding["message"]), (shape, finding["message"])
        truth = _truth(pytester, f"{shape}-True")
        assert finding["bytes"] == pytest.approx(truth, rel=0.2), (shape, finding, truth)


WHY = '''
import mmap
import multiprocessing
import tracemalloc

import pyarrow as pa
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info


class Items(Dataset):
    """Worker 1 of 4 keeps a written 256 KiB private anonymous mapping for each item it makes
    (with ``leak``): memory outside malloc, Python's allocator and every pool, 6 MiB an
    epoch."""

    def __init__(self, leak):
        self.leak, self.kept = leak, []

    def __len__(self):
        return 96

    def __getitem__(self, index):
        if self.leak and get_worker_info().id == 1:
            block = mmap.mmap(-1, 256 << 10, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            block.write(b"x" * (256 << 10))
            self.kept.append(block)
        return torch.full((16,), float(index))


@pytest.mark.memleak(phase="validation", max_growth="1MB", warmup=5, max_drift="4MB")
@pytest.mark.parametrize("leak", [True, False], ids=["leak", "clean"])
def test_a_worker_maps_memory_itself(memtrace, leak):
    loader = DataLoader(Items(leak), batch_size=1, num_workers=4, persistent_workers=True)
    for epoch in range(3):
        with memtrace.phase("validation", epoch=epoch):
            for batch, _ in enumerate(loader):
                memtrace.checkpoint("VALIDATION_BATCH", batch=batch)


@pytest.mark.memleak(phase="validation", max_growth="1MB", warmup=5, max_drift="1MB")
@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "per-epoch"])
def test_clean_loader_workers_over_epochs(memtrace, persistent):
    loader = DataLoader(Items(False), batch_size=1, num_workers=2, persistent_workers=persistent)
    for epoch in range(4):
        with memtrace.phase("validation", epoch=epoch):
            for batch, _ in enumerate(loader):
                memtrace.checkpoint("VALIDATION_BATCH", batch=batch)


@pytest.mark.memleak(phase="validation", max_growth="4MB", warmup=5)
def test_clean_a_pyarrow_table_rebuilt_every_batch(memtrace):
    """mimalloc keeps the pages a freed table had: resident memory rises once, then stays."""
    with memtrace.phase("validation", epoch=0):
        for batch in range(176):
            table = pa.table({f"c{k}": pa.array([float(batch)] * 4096) for k in range(8)})
            del table
            memtrace.checkpoint("VALIDATION_BATCH", batch=batch)


@pytest.mark.memleak(phase="validation", max_growth="4MB", warmup=5)
def test_clean_small_objects_made_and_freed_arenas_kept(memtrace):
    """Many small objects made and freed each batch: pymalloc keeps its arenas, and what they
    held is no growth."""
    with memtrace.phase("validation", epoch=0):
        for batch in range(176):
            made = [float(i) for i in range(20_000)]
            del made[::2]
            memtrace.checkpoint("VALIDATION_BATCH", batch=batch)
            del made
'''


def test_memory_no_counter_reads_and_workers_over_epochs(pytester):
    """A worker's own private mapping fails as growth outside what leakgate reads, named by
    the worker; loaders whose workers persist or restart each epoch, a pool that keeps freed
    pages and arenas kept after their objects died pass."""
    pytester.makepyfile(test_why=WHY)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "--memreport=out", "-rA")
    text = result.stdout.str()
    result.assert_outcomes(passed=5, failed=1)
    for clean in (
        "test_a_worker_maps_memory_itself[clean]",
        "test_clean_loader_workers_over_epochs[persistent]",
        "test_clean_loader_workers_over_epochs[per-epoch]",
        "test_clean_a_pyarrow_table_rebuilt_every_batch",
        "test_clean_small_objects_made_and_freed_arenas_kept",
    ):
        assert f"PASSED test_why.py::{clean}" in text, (clean, text)
    verdict = _verdict(_verdicts(pytester), "test_a_worker_maps_memory_itself[leak]")
    (finding,) = [f for f in verdict["findings"] if f["kind"] == Kind.CHILD_LEAK]
    assert re.search(
        r"worker 1 \+[\d.]+MiB .* of anon outside what leakgate reads", finding["message"]
    )
    assert "worker 0 +" not in finding["message"] and "worker 2 +" not in finding["message"]


class StandInDevice(Probe):
    """A device that is not the host (as a GPU is), its memory a count the test moves."""

    name, metrics, primary, capacity_metric = (
        "stand-in:0",
        ("allocated", "peak"),
        "allocated",
        "allocated",
    )
    capacity, host = 1 << 30, False

    def __init__(self) -> None:
        self.notes, self.used = [], 0

    def sample(self) -> dict[str, int | None]:
        return {"allocated": self.used, "peak": self.used}

    def reset_peak(self) -> None:
        pass

    def release(self) -> None:
        pass

    def describe(self) -> dict[str, object]:
        return {"device": "stand-in", "total_memory": self.capacity, "driver": None}

    def close(self) -> None:
        pass


def _on_the_stand_in(tmp_path, keep_on_host: bool, host: bool = True):
    """A validation loop on the stand-in device that moves each prediction to the host, and
    keeps it there (the usual cure for a device's out-of-memory) with ``keep_on_host``."""
    rules = Rules(phase="validation", max_growth="4MB", warmup=5, host=host)
    tmp_path.mkdir()
    device = StandInDevice()
    kept = []
    with Recorder(device, rules=rules, children=False) as rec:
        with rec.phase("validation", epoch=0):
            for batch in range(176):
                device.used = 64 << 20  # the device's memory stays level
                out = torch.randn(1024, 8)
                if keep_on_host:
                    kept.append(out.clone())
                rec.checkpoint("VALIDATION_BATCH", batch=batch)
        finished = finish_run(rec, rules, name="stand-in", directory=tmp_path)
    return finished


def test_the_host_beside_a_device_is_judged_by_the_same_rules(tmp_path):
    leak = _on_the_stand_in(tmp_path / "leak", keep_on_host=True)
    clean = _on_the_stand_in(tmp_path / "clean", keep_on_host=False)
    off = _on_the_stand_in(tmp_path / "off", keep_on_host=True, host=False)
    assert leak.verdict.status == "FAIL", leak.verdict.findings
    (finding,) = leak.verdict.findings
    assert finding.kind == Kind.LEAK and finding.evidence[0].metric == "host_allocated"
    assert finding.message.startswith("leak on the host in validation epoch 0")
    assert finding.bytes == pytest.approx(171 * 1024 * 8 * 4, rel=0.2)
    assert clean.verdict.status == "PASS", clean.verdict.findings
    assert off.verdict.status == "PASS", off.verdict.findings  # the user turned the host off
    report = (tmp_path / "leak" / "stand-in.md").read_text()
    assert "leak on the host in validation epoch 0" in report
    assert "host_allocated" in report

"""Holders named as users meet their leaks: through ``pytest --memreport`` with real markers
(epochs, ``max_drift``, warm-up), each leak naming what a user must cut with at least half of
the growth, and its clean twin passing."""

import re

import pytest

import harness.recorder  # noqa: F401

# harness.recorder (with harness.heap_board) imported here is in every snapshot pytester
# restores: a copy imported afresh by each run would wrap the DataLoader worker loop that the
# last copy wrapped.

CASES = """
import contextlib
import copy

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256))


DRIFT = pytest.mark.memleak(phase="train", max_growth="64MB", max_drift="4MB", warmup=2)


class Monitor:
    def __init__(self):
        self.schedulers = []


def epochs_with_fresh_optimizers(memtrace, keep):
    model, monitor = make_model(), Monitor()
    for epoch in range(4):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
        if keep:
            monitor.schedulers.append(scheduler)
        with memtrace.phase("train", epoch=epoch):
            for i in range(8):
                loss = model(torch.randn(8, 256)).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                memtrace.checkpoint("TRAIN_BATCH", batch=i)
        scheduler.step()


@DRIFT
def test_leak_each_epochs_optimizer_kept(memtrace):
    epochs_with_fresh_optimizers(memtrace, keep=True)


@DRIFT
def test_clean_each_epochs_optimizer_dropped(memtrace):
    epochs_with_fresh_optimizers(memtrace, keep=False)


class Keeper:
    def __init__(self):
        self.copies = []


def epochs_with_copies(memtrace, keep):
    model, keeper = make_model(), Keeper()
    for epoch in range(4):
        with memtrace.phase("train", epoch=epoch):
            for i in range(8):
                with torch.no_grad():
                    model(torch.randn(8, 256))
                memtrace.checkpoint("TRAIN_BATCH", batch=i)
        best = copy.deepcopy(model)  # between phases
        if keep:
            keeper.copies.append(best)


@DRIFT
def test_leak_a_copy_kept_after_each_epoch(memtrace):
    epochs_with_copies(memtrace, keep=True)


@DRIFT
def test_clean_a_copy_made_and_dropped(memtrace):
    epochs_with_copies(memtrace, keep=False)


class GuardedEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = make_model()

    def forward(self, x):
        h = self.inner(x)
        if h.abs().max() > 0:
            raise ValueError("activation out of range")
        return h


def stored_errors(memtrace, keep_traceback):
    encoder, errors = GuardedEncoder(), []
    with memtrace.phase("validation", epoch=0):
        for i in range(60):
            try:
                encoder(torch.randn(64, 256))
            except ValueError as error:
                errors.append(error if keep_traceback else repr(error))
            memtrace.checkpoint("VALIDATION_BATCH", batch=i)


@pytest.mark.memleak(phase="validation", max_growth="2MB", warmup=5)
def test_leak_exceptions_kept_with_their_tracebacks(memtrace):
    stored_errors(memtrace, keep_traceback=True)


@pytest.mark.memleak(phase="validation", max_growth="2MB", warmup=5)
def test_clean_exceptions_kept_as_text(memtrace):
    stored_errors(memtrace, keep_traceback=False)


TABLE = torch.ones(100_000)


def views_of_a_table(memtrace, keep):
    picked = []
    with memtrace.phase("validation", epoch=0):
        for i in range(60):
            rows = [TABLE[j : j + 10] for j in range(200)]  # views: no storage of their own
            if keep:
                picked.extend(rows)
            memtrace.checkpoint("VALIDATION_BATCH", batch=i)


@pytest.mark.memleak(phase="validation", max_growth="2MB", warmup=5)
def test_leak_views_of_a_table_kept(memtrace):
    views_of_a_table(memtrace, keep=True)


@pytest.mark.memleak(phase="validation", max_growth="2MB", warmup=5)
def test_clean_views_of_a_table_dropped(memtrace):
    views_of_a_table(memtrace, keep=False)


def operators(memtrace, profiler):
    x = torch.randn(8, 8)
    with profiler:
        with memtrace.phase("validation", epoch=0):
            for i in range(60):
                for _ in range(50):
                    x = (x * 1.0001).relu_()
                memtrace.checkpoint("VALIDATION_BATCH", batch=i)


@pytest.mark.memleak(phase="validation", max_growth="2MB", warmup=5)
def test_leak_profiler_left_recording(memtrace):
    operators(memtrace, torch.profiler.profile(record_shapes=True))


@pytest.mark.memleak(phase="validation", max_growth="2MB", warmup=5)
def test_clean_profiler_not_started(memtrace):
    operators(memtrace, contextlib.nullcontext())


class MosaicDataset(Dataset):
    # decodes each item (64 KiB) and, with keep, keeps it in buffer

    def __init__(self, keep):
        self.keep = keep
        self.buffer = []

    def __len__(self):
        return 2 * 120

    def __getitem__(self, index):
        decoded = torch.ones(16_384)
        if self.keep:
            self.buffer.append(decoded)
        return decoded.sum()


def in_workers(memtrace, keep, *, epochs=1, persistent=False):
    dataset = MosaicDataset(keep)
    loader = DataLoader(
        dataset, batch_size=2, num_workers=2, persistent_workers=persistent,
        multiprocessing_context="fork",
    )
    for epoch in range(epochs):
        with memtrace.phase("validation", epoch=epoch):
            for i, _ in enumerate(loader):
                memtrace.checkpoint("VALIDATION_BATCH", batch=i)
        dataset.buffer.clear()  # in this process: each worker keeps its own copy


WORKERS = pytest.mark.memleak(phase="validation", max_growth="2MB", warmup=5)


@WORKERS
def test_leak_a_cache_in_each_worker(memtrace):
    in_workers(memtrace, keep=True)


@WORKERS
def test_clean_nothing_cached_in_the_workers(memtrace):
    in_workers(memtrace, keep=False)


@WORKERS
def test_leak_a_buffer_cleared_in_the_main_process_only(memtrace):
    in_workers(memtrace, keep=True, epochs=2, persistent=True)


@WORKERS
def test_clean_persistent_workers_keeping_nothing(memtrace):
    in_workers(memtrace, keep=False, epochs=2, persistent=True)
"""

NAMED = {
    "a_cache_in_each_worker": r"MosaicDataset\.buffer \(list, \d+ items",
    "a_buffer_cleared_in_the_main_process_only": r"MosaicDataset\.buffer \(list, \d+ items",
    "profiler_left_recording": r"<torch profiler> \(events in C\+\+",
    "views_of_a_table_kept": r"views_of_a_table:picked \(list, \d+ items",
    "each_epochs_optimizer_kept": r"Monitor\.schedulers \(list, \d+ items",
    "a_copy_kept_after_each_epoch": r"Keeper\.copies \(list, \d+ items",
    "exceptions_kept_with_their_tracebacks": r"stored_errors:errors \(list, 60 items",
}
HELD = re.compile(r"held: ([\d.]+) of ([\d.]+) [KMG]iB")


def outcomes(pytester: pytest.Pytester, *args: str) -> dict[str, tuple[str, str]]:
    """Each case's outcome and failure text, run through the plugin."""
    pytester.makepyfile(test_cases=CASES)
    result = pytester.runpytest("-p", "no:randomly", "-p", "no:cacheprovider", "--memreport", *args)
    reports = result.reprec.getreports("pytest_runtest_logreport")  # type: ignore[attr-defined]
    return {
        r.nodeid.split("::test_")[-1]: (r.outcome, str(r.longrepr or ""))
        for r in reports
        if r.when == "call"
    }


@pytest.mark.parametrize("explain", [False, True], ids=["plain", "explain"])
def test_each_leak_names_what_holds_it_with_most_of_the_growth_and_its_twin_passes(
    pytester, explain
):
    found = outcomes(pytester, *(["--memreport-explain"] if explain else []))
    assert len(found) == 2 * len(NAMED)
    for name, (outcome, text) in found.items():
        if name.startswith("clean_"):
            assert outcome == "passed", (name, text)
            continue
        assert outcome == "failed", name
        holder = re.search(r"held (?:in \S+ \d+ )?by (.+)", text)
        assert holder and re.match(NAMED[name[len("leak_") :]], holder[1]), (name, text)
        held, whole = map(float, HELD.search(text).groups())
        assert held >= 0.5 * whole, (name, text)

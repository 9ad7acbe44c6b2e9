"""A worker that maps memory itself, outside malloc (``mmap.mmap(-1, n)``, anonymous and shared
as Python makes it), leaks as any other: the live heap a worker publishes counts the shared
memory it touched. Batches of MiBs that torch hands over in shared memory stay no growth. Run
through the plugin, in a process of its own."""

import harness._recorder  # noqa: F401

CASES = """
import mmap

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info


class Items(Dataset):
    # worker 3 keeps a written 64 KiB anonymous mapping for each item it makes, with keep

    def __init__(self, keep, size):
        self.keep, self.size, self.kept = keep, size, []

    def __len__(self):
        return 240

    def __getitem__(self, index):
        if self.keep and get_worker_info().id == 3:
            block = mmap.mmap(-1, 64 << 10)
            block.write(b"x" * (64 << 10))
            self.kept.append(block)
        return torch.full((self.size,), float(index))


def validate(memtrace, items):
    loader = DataLoader(items, batch_size=1, num_workers=4, persistent_workers=True)
    with memtrace.phase("validation", epoch=0):
        for batch, _ in enumerate(loader):
            memtrace.checkpoint("VALIDATION_BATCH", batch=batch)


@pytest.mark.memleak(phase="validation", max_growth="1MB", warmup=5)
def test_leak_mappings_kept(memtrace):
    validate(memtrace, Items(True, 16))


@pytest.mark.memleak(phase="validation", max_growth="1MB", warmup=5)
def test_clean_mappings_dropped(memtrace):
    validate(memtrace, Items(False, 16))


@pytest.mark.memleak(phase="validation", max_growth="1MB", warmup=5)
def test_clean_batches_of_8_mib_in_shared_memory(memtrace):
    validate(memtrace, Items(False, 2 << 20))
"""


def test_mappings_a_worker_keeps_outside_malloc_fail_and_their_twins_pass(pytester):
    pytester.makepyfile(test_cases=CASES)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "--memreport=reports", "-rA")
    text = result.stdout.str()
    result.assert_outcomes(passed=2, failed=1)
    assert "PASSED test_cases.py::test_clean_mappings_dropped" in text, text
    assert "PASSED test_cases.py::test_clean_batches_of_8_mib_in_shared_memory" in text, text
    assert "child-leak in validation epoch 0: worker 3 +" in text, text
    assert "worker 0 +" not in text and "worker 2 +" not in text, text

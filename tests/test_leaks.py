"""The workload's own leak gate: the clean trainer under the memleak marker.

These tests are what ``nox -s gpu_leak`` runs with ``-m memleak`` (on CUDA when a GPU is
visible); the fault catalogue's detection matrix shows the same rules failing on each bug.
"""

import pytest
from workload import Windows, make_model

from tft.trainer import TrainConfig, Trainer


@pytest.fixture(scope="module", autouse=True)
def warm_kernels():
    """Run the workload once untraced, at every batch size the tests use: torch allocates
    kernel caches (one per shape) and thread pools on first use, once per process, and that is
    not a leak of the code under test."""
    for batch_size in (1, 4):
        config = TrainConfig(epochs=1, batch_size=batch_size)
        Trainer(make_model(), config).fit(Windows(8), Windows(4))


@pytest.mark.memleak(phase=("training", "validation"), max_growth="256KiB", teardown="1MB")
def test_training_and_validation_hold_no_memory_across_batches(memtrace):
    config = TrainConfig(epochs=2, batch_size=1)
    Trainer(make_model(), config, callbacks=[memtrace]).fit(Windows(48), Windows(32, seed=1))
    assert {s.label for s in memtrace.samples} >= {"TRAIN_BATCH", "VALIDATION_BATCH"}


@pytest.mark.memleak(max_drift="256KiB", teardown="1MB")
def test_epochs_start_where_the_previous_one_started(memtrace):
    config = TrainConfig(epochs=3, batch_size=4)
    Trainer(make_model(), config, callbacks=[memtrace]).fit(Windows(32), Windows(16, seed=1))

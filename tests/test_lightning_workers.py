"""The Lightning callback sees the fit's DataLoader workers: a cache kept inside them fails
naming the worker, and the clean twin passes."""

from __future__ import annotations

import gc
import os

import pytest
import torch

L = pytest.importorskip("lightning")

from test_lightning import Forecaster, trainer  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from workload import WorkerCache  # noqa: E402

from harness._verdict.model import Kind, Rules  # noqa: E402
from harness.integrations.lightning import LeakGateCallback  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="needs Linux /proc"),
    pytest.mark.filterwarnings(
        "ignore:.*does not have many workers:UserWarning", "ignore:.*LeafSpec.*"
    ),
]

RULES = Rules(phase="validation", max_growth="4MB", warmup=5)
"""The issue's marker: the workers' growth is judged without a new argument."""


def workers_loader(windows: int, leaky: tuple[int, ...] = ()) -> DataLoader:
    """``windows`` windows of 64 steps, one per batch, read by 2 forked workers (started anew
    each epoch) that keep 64 KiB per window when ``leaky`` names them."""
    g = torch.Generator().manual_seed(windows)
    data = TensorDataset(torch.randn(windows, 64, 4, generator=g), torch.randn(windows, 1))
    return DataLoader(
        WorkerCache(leaky, data), batch_size=1, num_workers=2, multiprocessing_context="fork"
    )


@pytest.mark.parametrize("leaky", [(0, 1), ()], ids=["cache", "clean"])
def test_a_cache_in_the_fits_workers_fails_naming_them(leaky):
    """Training and validation both read through workers, over 2 epochs after the sanity
    check: the validation workers are ``worker 0`` and ``worker 1`` in every epoch, though
    Lightning makes each epoch's iterator while the last one lives. Each keeps 80 windows of
    64 KiB, over the 4 MB a worker may grow."""
    gc.collect()  # earlier tests' loaders shut their workers down first
    callback = LeakGateCallback(rules=RULES)
    torch.manual_seed(0)
    trainer(callback, 2).fit(Forecaster(), workers_loader(8), workers_loader(160, leaky))
    verdict = callback.finished.verdict
    checks = {c.scope for c in verdict.checks if c.rule == "max_child_growth"}
    assert {f"validation epoch {e}, worker {w}" for e in (0, 1) for w in (0, 1)} <= checks
    if not leaky:
        assert verdict.passed, [f.message for f in verdict.findings]
        return
    assert verdict.status == "FAIL"
    # Workers forked from a long-lived process may fill its heap's free pages first, which read
    # as copied (a P2 copy-on-read warning beside the failure).
    (finding,) = [f for f in verdict.findings if f.blocking]
    assert finding.kind == Kind.CHILD_LEAK and "(2 of 2 epochs)" in finding.message
    assert "worker 0 +" in finding.message and "worker 1 +" in finding.message
    assert "loader" not in finding.message

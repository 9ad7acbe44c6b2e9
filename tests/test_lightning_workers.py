"""The Lightning callback sees the fit's DataLoader workers: a cache kept inside them fails
naming the worker, and the clean twin passes."""

from __future__ import annotations

import gc
import os

import pytest
import torch

L = pytest.importorskip("lightning")

from test_lightning import Forecaster, loader, trainer  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from workload import WorkerCache  # noqa: E402

from harness.integrations.lightning import LeakGateCallback  # noqa: E402
from harness.verdict import Kind, Rules  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="needs Linux /proc"),
    pytest.mark.filterwarnings(
        "ignore:.*does not have many workers:UserWarning", "ignore:.*LeafSpec.*"
    ),
]

RULES = Rules(phase="validation", max_growth="4MB", warmup=5)
"""The issue's marker: the workers' growth is judged without a new argument."""


def workers_loader(leaky: tuple[int, ...]) -> DataLoader:
    """240 windows of 64 steps, one per batch, read by 2 forked workers that keep 64 KiB per
    window when ``leaky`` names them."""
    g = torch.Generator().manual_seed(1)
    windows = TensorDataset(torch.randn(240, 64, 4, generator=g), torch.randn(240, 1))
    return DataLoader(
        WorkerCache(leaky, windows),
        batch_size=1,
        num_workers=2,
        multiprocessing_context="fork",
    )


@pytest.mark.parametrize("leaky", [(0, 1), ()], ids=["cache", "clean"])
def test_a_cache_in_the_fits_workers_fails_naming_them(leaky):
    gc.collect()  # earlier tests' loaders shut their workers down first
    callback = LeakGateCallback(rules=RULES)
    torch.manual_seed(0)
    trainer(callback, 1, num_sanity_val_steps=0).fit(
        Forecaster(), loader(8, 0), workers_loader(leaky)
    )
    verdict = callback.finished.verdict
    checks = {c.scope for c in verdict.checks if c.rule == "max_child_growth"}
    assert {"validation epoch 0, worker 0", "validation epoch 0, worker 1"} <= checks
    if not leaky:
        assert verdict.passed, [f.message for f in verdict.findings]
        return
    assert verdict.status == "FAIL"
    (finding,) = verdict.findings
    assert finding.kind == Kind.CHILD_LEAK
    assert "worker 0 +" in finding.message and "worker 1 +" in finding.message

"""What ``--memreport-explain`` adds to the process it explains, and what it takes for the
test's: torch's compiler, which torch imports lazily at the first optimizer made, is imported
before tracing starts, so that an optimizer made in an explained test is never named as native
memory still held; and no fork hook is registered before explain first opens."""

import subprocess
import sys

import pytest

TEST = """
import pytest
import torch
from torch import nn


@pytest.mark.memleak(phase="train", max_growth="1MB", warmup=2)
def test_a_fresh_optimizer(memtrace):
    model = nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # the process's first optimizer
    kept = []
    with memtrace.phase("train", epoch=0):
        for i in range(32):
            optimizer.zero_grad()
            model(torch.randn(8, 16)).pow(2).mean().backward()
            optimizer.step()
            kept.append(torch.ones(64 * 1024))  # a leak, so that the failure names its lines
            memtrace.checkpoint("TRAIN_BATCH", batch=i)
"""


def test_an_optimizer_made_in_an_explained_test_is_no_native_line(pytester):
    pytest.importorskip("memray")
    source = pytester.makepyfile(test_loop=TEST).read_text().splitlines()
    made = next(n for n, line in enumerate(source, 1) if "torch.optim.SGD" in line)
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "--memreport=o", "--memreport-explain"
    )
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "held by test_a_fresh_optimizer:kept" in out
    assert "native: test_loop.py:" in out  # the native lines were named
    assert f"native: test_loop.py:{made} " not in out


def test_importing_the_explain_bookkeeping_registers_no_fork_hook():
    script = """
import os
calls = []
register = os.register_at_fork
os.register_at_fork = lambda **hooks: calls.extend(hooks.values()) or register(**hooks)
import harness.attribution.lines as lines
ours = lambda: [f for f in calls if (getattr(f, "__module__", None) or "").startswith("harness")]
print(len(ours()))
lines.Lines().open()
print(len(ours()))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "1"]

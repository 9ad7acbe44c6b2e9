"""What ``--memreport-explain`` adds to the process it explains, and what it takes for the
test's: torch's compiler, which torch imports lazily at the first optimizer made, is imported
before tracing starts, so that an optimizer made in an explained test is never named as native
memory still held; no fork hook is registered before explain first opens; and a child forked
while explain traces is first read once explain's traces are let go of in it, whichever at-fork
hook was registered first."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

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
import harness._attribution.lines as lines
ours = lambda: [f for f in calls if (getattr(f, "__module__", None) or "").startswith("harness")]
print(len(ours()))
lines.Lines().open()
print(len(ours()))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "1"]


FORKED = """
import os, sys, time, tracemalloc
from harness._attribution.lines import Lines
from harness._measure import heap_board
from harness._measure.patches import PATCHES

heap_board.PERIOD = 3600.0  # no reading on the child's timer: only its first, then the asked
PATCHES.hold(heap_board.WORKERS)
board = heap_board.board()
early = os.fork()  # the board's child hook is registered at the first fork, before explain's
if early == 0:
    os._exit(0)
os.waitpid(early, 0)
lines = Lines()
lines.open()
lines.trace()
kept = [str(i) * 3 for i in range(200_000)]  # a trace each, which the child frees
traces = tracemalloc.get_tracemalloc_memory()
ready, go = os.pipe(), os.pipe()
child = os.fork()
if child == 0:
    os.write(ready[1], b"x")
    os.read(go[0], 1)
    heap_board._slot.publish()  # once every at-fork hook has run
    os.read(go[0], 1)
    os._exit(0)
os.read(ready[0], 1)
first = board.read(child)
os.write(go[1], b"x")
while (then := board.read(child)) is None or then.count < 2:
    time.sleep(0.001)
os.write(go[1], b"x")
os.waitpid(child, 0)
print(first.count, first.heap - then.heap, traces)
"""


def test_a_child_forked_while_explain_traces_is_first_read_without_its_traces():
    from harness._measure.malloc import live_heap

    if live_heap() is None:
        pytest.skip("needs glibc's mallinfo2")
    done = subprocess.run(
        [sys.executable, "-c", FORKED],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    count, dropped, traces = map(int, done.stdout.split())
    assert count == 1 and traces > 4 << 20  # the first reading, made with 200,000 traces
    assert dropped < traces / 4  # the child's heap did not fall by its traces once it was read

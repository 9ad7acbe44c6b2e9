"""The plugin under a user's own tools (a torch profiler left running, a tracer that keeps every
call it sees), and on models that refuse inspection: leakgate's searches are never recorded by
those tools, so its own work never becomes growth, and a lazy module is skipped without a word.

Each loop writes what it saw (the searches run, the calls its tracer recorded from a search, the
largest step between two readings) to ``seen.json``; a search that the tool recorded ends the
test process at once (``os._exit``), so that the failure costs seconds, not the gigabytes a
profiler's post-processing of a recorded search takes."""

import json

import pytest

LOOP = """
import json, os, sys
import pytest
import torch

torch.manual_seed(0)
SEARCH = ("walk.py", "names.py", "holders.py", "retained.py", "graph.py", "dominators.py")
STEP = 2**20  # a batch of these loops adds about 16 KiB; a recorded search adds tens of MiB


def loop(memtrace, batches, work, recorded=lambda: 0):
    steps = []
    with memtrace.phase("validation"):
        for batch in range(batches):
            work()
            memtrace.checkpoint("VALIDATION_BATCH", batch=batch)
            samples = memtrace.samples
            steps.append(samples[-1].get("allocated") - samples[-2].get("allocated"))
            if (batch > 5 and steps[-1] > STEP) or recorded():
                os._exit(3)  # a search was recorded: stop here, before the tool's own clean-up
    seen = {"searches": memtrace.attribution.searches, "step": max(steps[6:])}
    with open("seen.json", "w") as out:
        json.dump({**seen, "recorded": recorded()}, out)
"""


def run(pytester: pytest.Pytester, body: str) -> tuple[pytest.RunResult, dict]:
    pytester.makepyfile(test_loop=LOOP + body)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    seen = pytester.path / "seen.json"
    return result, json.loads(seen.read_text()) if seen.exists() else {}


def test_a_profiler_left_running_fails_as_a_leak_and_never_records_a_search(pytester):
    result, seen = run(
        pytester,
        """
from torch.profiler import ProfilerActivity, profile

@pytest.fixture
def prof():
    prof = profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        profile_memory=True,
        with_stack=True,
    )
    yield prof
    prof.stop()  # after the test: still recording as it ends, so its events are a leak


@pytest.mark.memleak(phase="validation", max_growth="64KB", warmup=5)
def test_profiled(memtrace, prof):
    model = torch.nn.Linear(64, 64)
    prof.start()  # and never stopped while the loop runs: its events pile up
    loop(memtrace, 24, lambda: model(torch.randn(8, 64)))
""",
    )
    out = result.stdout.str()
    assert seen, out  # the loop ran to its end: no reading jumped by a recorded search
    assert result.ret == 1
    assert "FAIL" in out and "[P0 leak] leak in validation" in out
    assert "MemoryError" not in out and "INTERNALERROR" not in out
    assert "attribution at" not in out
    # Where the growth crossed its budget, each time it doubled, and at the end: the searches
    # added nothing to the growth, so it doubled no faster than the profiler's events grow.
    assert 2 <= seen["searches"] <= 4
    assert seen["step"] < 2**20


def test_a_tracer_that_keeps_every_call_never_sees_a_search(pytester):
    result, seen = run(
        pytester,
        """
CALLS = []

def tracer(frame, event, arg):
    CALLS.append(frame.f_code)  # a tracer that keeps what it saw, as a coverage tool does
    return None

def recorded():
    names = {code.co_filename for code in CALLS}
    return sum(1 for name in names if "harness" in name and name.endswith(SEARCH))

@pytest.mark.memleak(phase="validation", max_growth="64KB", warmup=5)
def test_traced(memtrace):
    kept = []
    sys.settrace(tracer)
    try:
        loop(memtrace, 24, lambda: kept.append(torch.ones(4096)), recorded)
    finally:
        sys.settrace(None)
""",
    )
    out = result.stdout.str()
    assert seen, out
    assert seen["recorded"] == 0
    assert result.ret == 1 and "[P0 leak] leak in validation" in out
    assert "held by test_traced:kept" in out
    assert 2 <= seen["searches"] <= 4


def test_a_lazy_module_is_searched_without_a_warning(pytester):
    result, seen = run(
        pytester,
        """
@pytest.mark.memleak(phase="validation", max_growth="64KB", warmup=5, attribute=True)
def test_lazy(memtrace):
    model = torch.nn.Sequential(torch.nn.LazyLinear(32), torch.nn.LazyLinear(1024))
    spare = torch.nn.LazyLinear(8)  # never run: its parameters stay uninitialized
    kept = []
    loop(memtrace, 24, lambda: kept.append(model(torch.randn(16, 64)).detach()))
""",
    )
    out = result.stdout.str()
    assert seen, out
    assert "attribution at" not in out and "RuntimeWarning" not in out
    assert result.ret == 1 and "held by test_lazy:kept" in out

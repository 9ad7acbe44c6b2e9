"""``--memreport-explain`` beside a user's own tools: it leaves each as it found it (a profile
function set before or inside the test stays the test's, a profiler records on), and its own
memory is never growth (a clean loop under the user's tracemalloc or a FlopCounterMode passes)."""

import harness._recorder  # noqa: F401

# harness._recorder imported here is in every snapshot pytester restores (see
# tests/test_explain_verdict.py).

CASES = """
import sys
import threading
import tracemalloc

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

pytestmark = pytest.mark.memleak(phase="validation", max_growth="4MB", warmup=5)


def loop(memtrace, batches=176, check=lambda: None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
    with memtrace.phase("validation", epoch=0):
        for i in range(batches):
            with torch.no_grad():
                model(torch.randn(8, 64))
            check()
            memtrace.checkpoint("VALIDATION_BATCH", batch=i)


def test_under_an_active_profiler(memtrace):
    with torch.profiler.profile():
        loop(memtrace, batches=40)


def mine(frame, event, arg):
    return None


@pytest.fixture
def profiled():
    sys.setprofile(mine)
    yield
    assert sys.getprofile() is mine  # still the user's after the test
    sys.setprofile(None)


def test_a_profile_function_set_stays_the_users(profiled, memtrace):
    def check():
        assert sys.getprofile() is mine

    loop(memtrace, check=check)


def test_a_profile_function_set_inside_stays_the_users(memtrace):
    def check():
        assert sys.getprofile() is mine

    sys.setprofile(mine)
    try:
        loop(memtrace, check=check)
    finally:
        sys.setprofile(None)


def test_a_thread_started_inside(memtrace):
    def check():
        worker = threading.Thread(target=lambda: None)  # its start sets memray's profile
        worker.start()
        worker.join()

    loop(memtrace, batches=40, check=check)


def test_under_the_users_tracemalloc(memtrace):
    tracemalloc.start()
    try:
        loop(memtrace)
    finally:
        tracemalloc.stop()


def test_under_a_flop_counter(memtrace):
    with FlopCounterMode(display=False):
        loop(memtrace)
"""


def test_explain_leaves_each_tool_as_it_found_it_and_passes_clean_loops(pytester):
    pytester.makepyfile(test_tools=CASES)
    result = pytester.runpytest("-p", "no:randomly", "--memreport-explain")
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(
        [
            "*explain noted no native lines*a profile function is set (sys.setprofile)*"
            "*the test set a profile function (sys.setprofile): memray stopped*"
        ]
    )
    (noted,) = [line for line in result.outlines if "explain noted no native lines" in line]
    assert "test_a_thread_started_inside" not in noted  # a thread's start is no user profile

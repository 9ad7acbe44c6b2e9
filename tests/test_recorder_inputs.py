"""The recorder's arguments are checked at the call, and its own storage is never judged."""

import pytest

from harness import Recorder, Rules, judge
from harness._core.errors import BadInput

BAD_CALLS = [
    ((5,), {}, TypeError),
    ((None,), {}, TypeError),
    (("X",), {"phase": ["x"]}, TypeError),
    (("X",), {"batch": "3"}, TypeError),
    (("X",), {"epoch": 1.5}, TypeError),
    (("X",), {"batch": True}, TypeError),
    (("X",), {"note": 7}, TypeError),
    (("",), {}, BadInput),
    (("X" * 10_000,), {}, BadInput),
    (("X",), {"batch": 10**30}, BadInput),
    (("X",), {"epoch": -1}, BadInput),
]


@pytest.mark.parametrize(("args", "kwargs", "error"), BAD_CALLS)
def test_bad_checkpoint_arguments_raise_at_the_call_and_record_nothing(args, kwargs, error):
    with Recorder("cpu") as rec:
        with pytest.raises(error, match="checkpoint"):
            rec.checkpoint(*args, **kwargs)
        assert len(rec.samples) == 0
        with pytest.raises(TypeError), rec.phase(["x"]):  # type: ignore[arg-type]
            pass


@pytest.mark.parametrize(("args", "kwargs", "error"), BAD_CALLS)
def test_a_bad_call_between_two_stride_readings_raises_the_same(args, kwargs, error):
    """Deep in a long loop, where batches take the short path between two readings, a bad
    call raises what it raises at the first checkpoint, and records nothing."""
    with Recorder("cpu") as rec:
        for batch in range(41):
            rec.checkpoint("X", batch=batch)
        with pytest.raises(error, match="checkpoint"):
            rec.checkpoint(*args, **{"batch": 41, **kwargs})
        assert len(rec.samples) == 41


def test_a_bad_call_fails_its_own_test_and_the_session_goes_on(pytester):
    pytester.makepyfile(
        """
import pytest


@pytest.mark.memleak(max_growth="1MB", allow_unjudged=True)
def test_bad(memtrace):
    memtrace.checkpoint(5)


@pytest.mark.memleak(max_growth="1MB", allow_unjudged=True)
def test_good(memtrace):
    memtrace.checkpoint("X", phase="validation", batch=0)
"""
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*BadArgument: checkpoint label: expected a str, got int*"])
    assert "INTERNALERROR" not in result.stdout.str()


def test_100k_no_op_checkpoints_are_not_a_leak_of_the_recorders_own_samples():
    with Recorder("cpu", children=False) as rec:  # another test's child would add columns
        with rec.phase("validation", epoch=0):
            for i in range(100_000):
                rec.checkpoint("VALIDATION_BATCH", batch=i)
        per_checkpoint = rec.samples.nbytes() / len(rec.samples)
        verdict = judge(rec.samples, Rules(phase="validation", max_growth="64KiB"))
    assert verdict.status == "PASS", verdict.findings
    assert per_checkpoint < 8 * len(rec.probe.metrics) + 48  # a column per metric, and the rest


def test_the_recorders_own_columns_do_not_read_as_growth():
    """glibc keeps the small chunks it frees in a per-thread cache that ``mallinfo2`` counts as
    in use: columns grown an item at a time read as ~45 KB of growth over the first thousand
    checkpoints of a loop that allocates nothing, more than the reference job's budget."""
    with Recorder("cpu", children=False) as rec:
        if rec.probe.primary != "allocated":
            pytest.skip("no mallinfo2 here")
        with rec.phase("validation", epoch=0):
            for i in range(3000):
                rec.checkpoint("VALIDATION_BATCH", batch=i)
        allocated = rec.samples.metric("allocated")
    assert abs(int(allocated[-1] - allocated[5])) < 4096

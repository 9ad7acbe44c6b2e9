"""Native allocation lines with memray (the optional extra): what a region still holds in
malloc or mmap is named by the Python line that allocated it."""

import inspect
import os

import pytest
import torch

pytest.importorskip("memray")

from harness._attribution import native
from harness._attribution.lines import Lines
from harness._attribution.native import Native, recheck

KEPT: list[torch.Tensor] = []


def setup_module() -> None:
    """Torch imports what a dispatch mode needs on first use; do it here, once, since pytester
    drops the modules a run imported and torch refuses to register their operators twice."""
    lines = Lines()
    lines.open()
    lines.close()


def keep_a_mebibyte() -> None:
    KEPT.append(torch.ones(256 * 1024))  # 1 MiB of float32 that outlives the call


def line_of(function, text: str) -> str:
    source, first = inspect.getsourcelines(function)
    offset = next(i for i, line in enumerate(source) if text in line)
    return f"{os.path.basename(__file__)}:{first + offset}"


def test_a_tensor_kept_in_a_module_list_is_named_by_the_line_that_allocated_it():
    KEPT.clear()
    found = recheck(lambda: [keep_a_mebibyte() for _ in range(3)])
    KEPT.clear()
    assert found, "memray named nothing"
    top = found[0]
    assert top.line.endswith(line_of(keep_a_mebibyte, "torch.ones"))
    assert top.bytes >= 3 * 2**20 and top.count >= 3
    assert top.text().startswith(f"native: {top.line} (") and "still held)" in top.text()


def test_a_region_that_frees_what_it_allocates_names_nothing():
    def clean() -> None:
        for _ in range(3):
            torch.ones(256 * 1024).mul(2).sum()

    clean()  # what torch sets up on first use is not the region's
    assert recheck(clean) == []


def test_the_capture_is_removed_after_the_region_even_when_it_raises():
    with Native() as tracked:
        capture = tracked.capture
        assert os.path.isfile(capture)
    assert tracked.found is not None
    assert not os.path.exists(os.path.dirname(capture))

    with pytest.raises(RuntimeError, match="boom"), Native() as failed:
        capture = failed.capture
        raise RuntimeError("boom")
    assert not os.path.exists(os.path.dirname(capture))


def test_without_memray_or_with_another_tracker_active_nothing_is_named(monkeypatch):
    with Native() as outer, Native() as inner:  # memray allows one tracker per process
        pass
    assert inner.found is None and not os.path.exists(inner.capture)
    assert outer.found is not None

    monkeypatch.setattr(native, "available", lambda: False)
    assert recheck(keep_a_mebibyte) is None
    KEPT.clear()


LEAKY = """
import pytest
import torch

HOLD = []


def grow():
    HOLD.append(torch.ones(16384))  # 64 KiB of float32, held by nothing the walk names


@pytest.mark.memleak(phase="validation", max_growth="1MB", explain=EXPLAIN)
def test_leaky(memtrace):
    with memtrace.phase("validation", epoch=0):
        for i in range(176):
            grow()
            memtrace.checkpoint("VALIDATION_BATCH", batch=i)
"""


@pytest.mark.parametrize("explain", [True, False])
def test_a_failing_explained_test_names_the_native_line(pytester, explain):
    pytester.makepyfile(test_leaky=LEAKY.replace("EXPLAIN", str(explain)))
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(failed=1)
    lines = LEAKY.strip().splitlines()
    grow = next(i for i, line in enumerate(lines, 1) if "HOLD.append" in line)
    if explain:
        named = f"  native: test_leaky.py:{grow} (*allocations, *MiB still held)"
        result.stdout.fnmatch_lines(["*leakgate: memory verdict FAIL*", "*P0 leak*", named])
        for own in ("memtrace.phase", "memtrace.checkpoint"):  # leakgate's own bookkeeping
            at = next(i for i, line in enumerate(lines, 1) if own in line)
            result.stdout.no_fnmatch_line(f"*native: test_leaky.py:{at} *")
    else:
        result.stdout.no_fnmatch_line("*native:*")


HELPERS = """
import pytest

SMALL = dict(phase="test", max_growth="100MB", allow_unjudged=True)


def tracked(tracker_class, path):
    with tracker_class(path):
        return [bytes(1000) for _ in range(100)]
"""

OWN_TRACKERS = """

@pytest.mark.memleak(**SMALL)
def test_imports_memray_itself(memtrace, tmp_path):
    import memray

    assert len(tracked(memray.Tracker, tmp_path / "own.bin")) == 100


@pytest.mark.memleak(**SMALL)
def test_runs_under_a_fixtures_tracker(memtrace, fixture_tracker):
    assert fixture_tracker
"""

MODULE_TRACKER = """
from memray import Tracker


@pytest.mark.memleak(**SMALL)
def test_module_tracker(memtrace, tmp_path):
    assert len(tracked(Tracker, tmp_path / "module.bin")) == 100
"""

TRACKER_FIXTURE = """
import memray
import pytest


@pytest.fixture
def fixture_tracker(tmp_path):
    with memray.Tracker(tmp_path / "fixture.bin"):
        yield True
"""


def test_explain_steps_aside_for_a_test_that_tracks_with_memray_itself(pytester):
    """Its own tracker imported by the module or in the test, or a fixture's around it: each
    test passes, and one line says explain noted nothing there and why."""
    pytester.makeconftest(TRACKER_FIXTURE)
    pytester.makepyfile(test_own=HELPERS + OWN_TRACKERS, test_module=HELPERS + MODULE_TRACKER)
    result = pytester.runpytest("-p", "no:randomly", "--memreport-explain")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "leakgate note: explain noted no native lines for 3 test(s), each for the reason "
            "given: "
            "test_module.py::test_module_tracker (test_module uses memray.Tracker); "
            "test_own.py::test_imports_memray_itself (test_imports_memray_itself uses "
            "memray.Tracker); test_own.py::test_runs_under_a_fixtures_tracker (memray could not "
            "track: No more than one Tracker instance can be active at the same time)"
        ]
    )

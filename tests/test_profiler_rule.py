"""A loop run inside the user's own ``torch.profiler.profile``, through ``pytest --memreport``:
growth the profiler's events hold is the profiler's (a ``profiler`` warning, reported, not a
leak) when the test stops the profiler before it ends, and a leak when the profiler is still
recording as the test ends; what Python holds inside a stopped profiler is a leak still."""

import json

import pytest

import harness._recorder  # noqa: F401  (in every snapshot pytester restores)
from harness._results.finish import finish_run
from harness._timeline.jsonl import read_timeline

CASES = """
import pytest
import torch

LATER = []


def operators(memtrace, keep=None):
    x = torch.randn(8, 8)
    with memtrace.phase("validation", epoch=0):
        for i in range(40):
            for _ in range(50):
                x = (x * 1.0001).relu_()
            if keep is not None:
                keep.append(torch.ones(16_384))
            memtrace.checkpoint("VALIDATION_BATCH", batch=i)


@pytest.fixture
def left_recording():
    profiler = torch.profiler.profile(record_shapes=True)
    yield profiler
    profiler.stop()  # after the test has ended


@pytest.mark.memleak(phase="validation", max_growth="2MB", warmup=5)
def test_stopped_before_the_end(memtrace):
    with torch.profiler.profile(record_shapes=True):
        operators(memtrace)


@pytest.mark.memleak(phase="validation", max_growth="2MB", warmup=5)
def test_recording_when_the_test_ends(memtrace, left_recording):
    left_recording.start()
    operators(memtrace)


@pytest.mark.memleak(phase="validation", max_growth="2MB", warmup=5)
def test_kept_inside_a_stopped_profiler(memtrace):
    kept = []
    with torch.profiler.profile(record_shapes=True):
        operators(memtrace, kept)
"""


def run(pytester: pytest.Pytester, name: str) -> tuple[str, str, dict, str]:
    """One case's outcome, failure text and saved verdict, and the terminal's text."""
    pytester.makepyfile(test_cases=CASES)
    result = pytester.runpytest(
        "-p", "no:randomly", "-p", "no:cacheprovider", "--memreport", "-k", name
    )
    reports = result.reprec.getreports("pytest_runtest_logreport")  # type: ignore[attr-defined]
    (report,) = [r for r in reports if r.when == "call"]
    (saved,) = pytester.path.glob(f"reports/*test_{name}-*.json")
    return (
        report.outcome,
        str(report.longrepr or ""),
        json.loads(saved.read_text()),
        (result.stdout.str()),
    )


def test_a_profiler_stopped_before_the_end_holds_a_warning_not_a_leak(pytester):
    outcome, text, saved, terminal = run(pytester, "stopped_before_the_end")
    assert outcome == "passed", text
    assert saved["status"] == "PASS"
    assert [f["kind"] for f in saved["findings"]] == ["profiler"]
    assert saved["findings"][0]["severity"] == "P2"
    assert "[P2 profiler]" in terminal and "<torch profiler>" in saved["findings"][0]["message"]
    (report,) = pytester.path.glob("reports/*test_stopped_before_the_end-*.md")
    assert "Held by a torch profiler stopped before the end" in report.read_text()
    # rebuilt from its timeline, the run reads the same: its end record says who held what
    (timeline,) = pytester.path.glob("reports/*test_stopped_before_the_end-*.jsonl")
    rebuilt = finish_run(read_timeline(timeline), name="rebuilt").verdict
    assert rebuilt.status == "PASS" and [f.kind for f in rebuilt.findings] == ["profiler"]


def test_a_profiler_still_recording_when_the_test_ends_fails_as_a_leak(pytester):
    outcome, text, saved, _ = run(pytester, "recording_when_the_test_ends")
    assert outcome == "failed"
    assert saved["status"] == "FAIL"
    assert "leak" in [f["kind"] for f in saved["findings"]]
    assert "held by <torch profiler> (events in C++" in text


def test_what_python_keeps_inside_a_stopped_profiler_is_a_leak(pytester):
    outcome, text, saved, _ = run(pytester, "kept_inside_a_stopped_profiler")
    assert outcome == "failed"
    assert "leak" in [f["kind"] for f in saved["findings"]]
    assert "profiler" not in [f["kind"] for f in saved["findings"]]
    # Python's list holds under half of the growth (the profiler the rest), over the budget
    held = {h["path"]: h["bytes"] for h in saved["attribution"]}
    assert "<torch profiler>" in held and 2 * held["operators:keep"] < saved["worst_growth"]
    assert held["operators:keep"] > 2_000_000, text

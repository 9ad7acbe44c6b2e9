"""What a pytest test's verdict is about: its own call, judged only on evidence.

Fixtures are outside the measured window; a rule that saw nothing is an error, not a pass; a
rule a user registers is judged, reported and saved like the built-in ones; xfail holds.
"""

import json

import pytest

COMMON = """
import gc
import pytest
import torch

PARKED = []
MIB16 = 4 * 2**20  # float32 elements in 16 MiB


def validation(memtrace, *, keep=False, batches=40):
    kept = []
    with memtrace.phase("validation", epoch=0):
        for i in range(batches):
            out = torch.ones(16384) * 2
            if keep:
                kept.append(out)
            memtrace.checkpoint("VALIDATION_BATCH", batch=i)
    return kept
"""


def run(pytester: pytest.Pytester, body: str, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_window=COMMON + body)
    return pytester.runpytest("-p", "no:randomly", *args)


def test_a_fixtures_model_is_neither_a_leak_nor_hides_one(pytester):
    result = run(
        pytester,
        """
@pytest.fixture
def model():
    layer = torch.nn.Linear(2048, 2048)  # 16 MiB of weights, freed at fixture teardown
    yield layer
    del layer


@pytest.mark.memleak(teardown="4MB")
def test_uses_a_fixture(model, memtrace):
    model(torch.ones(1, 2048))


@pytest.mark.memleak(teardown="4MB")
def test_parks_memory_beside_a_fixture(model, memtrace):
    PARKED.append(torch.ones(MIB16))
""",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_parks_memory_beside_a_fixture*", "*P0 teardown*"])


def test_teardown_anchors_before_the_model_when_a_trainer_drives_the_recorder(pytester):
    result = run(
        pytester,
        """
def session(memtrace, park):
    model = torch.nn.Linear(2048, 2048)  # built before the trainer's SESSION_START
    memtrace.checkpoint("SESSION_START", phase="session")
    validation(memtrace)
    if park:
        PARKED.append(torch.ones(MIB16))
    memtrace.checkpoint("SESSION_END", phase="session")
    del model


@pytest.mark.memleak(teardown="4MB")
def test_session_parks_16mib(memtrace):
    session(memtrace, park=True)


@pytest.mark.memleak(teardown="4MB")
def test_session_cleans_up(memtrace):
    session(memtrace, park=False)
""",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*FAIL*test_session_parks_16mib*", "*teardown: +16.[01]MiB*"])


def test_rules_that_judge_nothing_fail_the_test_with_the_phases_seen(pytester):
    result = run(
        pytester,
        """
@pytest.mark.memleak(phase="validaton", max_growth="1MB")
def test_typo(memtrace):
    validation(memtrace, keep=True)


@pytest.mark.memleak(max_growth="1MB")
def test_never_checkpoints(memtrace):
    torch.ones(10)


@pytest.mark.memleak(max_growth="1MB", warmup=50)
def test_shorter_than_warmup(memtrace):
    validation(memtrace, keep=True)


@pytest.mark.memleak(phase="validaton", max_growth="1MB", allow_unjudged=True)
def test_opted_out(memtrace):
    validation(memtrace)
""",
    )
    result.assert_outcomes(passed=1, failed=3)
    result.stdout.fnmatch_lines(
        [
            "*configuration error: the rule `phase='validaton'` matched no checkpoint; phases "
            "seen: validation; did you mean 'validation'?*",
            "*configuration error: the rule `max_growth='1MB'` matched no checkpoint; no "
            "checkpoints at all: pass `memtrace` to the trainer as a callback or call "
            "`memtrace.checkpoint`*",
            "*error: max_growth judged nothing: 0 batches after 50 warm-up*",
        ],
        consecutive=False,
    )


def test_a_registered_rule_fails_a_test_and_reaches_the_report_and_the_verdict(pytester):
    pytester.makeconftest(
        """
from harness import Finding, register_rule
from harness._core.units import format_size, parse_size


@register_rule("back_to_start")
def back_to_start(ctx, allowed):
    '''allocated must return to the phase's START reading at every VALIDATION_END.'''
    limit = parse_size(allowed)
    found = []
    starts = {}
    for i, s in enumerate(ctx.samples):
        if s.label == "validation START":
            starts[s.epoch] = i
        elif s.label == "validation END" and s.epoch in starts:
            kept = ctx.value(i, "allocated") - ctx.value(starts[s.epoch], "allocated")
            status = "FAIL" if kept > limit else "PASS"
            ctx.check("back_to_start", f"validation epoch {s.epoch}", status, f"kept {kept}")
            if status == "FAIL":
                message = f"validation kept {format_size(kept)} after its END"
                found.append(Finding("leak", s.phase, s.epoch, kept, message))
    return found
"""
    )
    result = run(
        pytester,
        """
@pytest.mark.memleak(back_to_start="256KiB")
def test_keeps_outputs(memtrace):
    global KEPT
    KEPT = validation(memtrace, keep=True)


@pytest.mark.memleak(back_to_start="256KiB")
def test_clean(memtrace):
    validation(memtrace)
""",
        "--memreport=out",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*[[]P0 leak[]] validation kept 2.5*after its END*"])
    (doc,) = [
        d
        for d in map(json.loads, (p.read_text() for p in (pytester.path / "out").glob("*.json")))
        if d["test"].endswith("test_keeps_outputs")
    ]
    (finding,) = doc["findings"]
    assert finding["rule"] == "back_to_start" and doc["rules"]["custom"] == {
        "back_to_start": "256KiB"
    }
    report = (pytester.path / "out" / doc["report"]).read_text()
    assert "after its END" in report


def test_an_xfail_test_that_fails_its_memory_rules_is_xfailed(pytester):
    result = run(
        pytester,
        """
@pytest.mark.xfail(reason="known leak")
@pytest.mark.memleak(phase="validation", max_growth="256KiB")
def test_known_leak(memtrace):
    validation(memtrace, keep=True)


@pytest.mark.xfail(reason="known leak", strict=True)
@pytest.mark.memleak(phase="validation", max_growth="256KiB")
def test_known_leak_strict(memtrace):
    validation(memtrace, keep=True)
""",
    )
    result.assert_outcomes(xfailed=2)
    assert result.ret == 0


def test_a_test_skipped_at_run_time_leaves_no_timeline_for_the_gate(pytester):
    result = run(
        pytester,
        """
@pytest.mark.memleak(max_growth="1MB")
def test_skips(memtrace):
    pytest.skip("not on this machine")


@pytest.fixture
def broken():
    raise RuntimeError("set-up failed")


@pytest.mark.memleak(max_growth="1MB")
def test_setup_fails(memtrace, broken):
    pass


@pytest.mark.memleak(max_growth="1MB")
def test_judged(memtrace):
    validation(memtrace)
""",
        "--memreport=out",
    )
    result.assert_outcomes(passed=1, skipped=1, errors=1)
    out = pytester.path / "out"
    assert sorted(p.name.split("-")[0] for p in out.glob("*.jsonl")) == ["test_window__test_judged"]
    from harness._frontends.cli import main

    assert main(["gate", str(out)]) == 0

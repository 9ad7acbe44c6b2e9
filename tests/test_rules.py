import json
import sys
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import harness
from harness._core.errors import BadArgument, BadInput
from harness._measure.sample import Sample
from harness._rules.judging import judge
from harness._rules.registry import register_rule, unregister_rule
from harness._verdict.model import SCHEMA_VERSION, CheckStatus, Finding, Severity, Status, Verdict
from harness._verdict.options import Rules, parse_option

KB = 1024
MB = 2**20
BASE = 1600 * MB
N = 176


def loop(values, *, phase="validation", epoch=0, metric="allocated", end=None, **metrics):
    """START, one sample per batch with ``values`` (and any per-batch ``metrics``), END."""
    name = phase.upper()
    out = [Sample(f"{name}_START", phase, epoch, None, 0.0, {metric: int(values[0])})]
    for b, v in enumerate(values):
        reading = {metric: int(v)} | {k: int(m[b]) for k, m in metrics.items() if m[b] is not None}
        out.append(Sample(f"{name}_BATCH", phase, epoch, b, 1.0 + b, reading))
    last = int(values[-1]) if end is None else int(end)
    out.append(Sample(f"{name}_END", phase, epoch, None, 2.0 + len(values), {metric: last}))
    return out


def noisy(slope=0.0, *, n=N, noise=2 * KB, seed=0, base=BASE):
    rng = np.random.default_rng(seed)
    return base + slope * np.arange(n) + rng.normal(0, noise, n)


def kinds(verdict):
    return sorted(f.kind for f in verdict.findings)


# -- leaks ---------------------------------------------------------------------------------------


def test_linear_leak_in_validation_fails_with_its_slope():
    verdict = judge(loop(noisy(64 * KB)), Rules(phase="validation", max_growth="5MB"))
    assert verdict.status == "FAIL"
    (leak,) = verdict.findings
    assert (leak.kind, leak.severity, leak.phase, leak.epoch) == ("leak", "P0", "validation", 0)
    assert leak.slope == pytest.approx(64 * KB, rel=0.01)
    assert leak.bytes == pytest.approx(64 * KB * 170, rel=0.02)
    assert [e.batch for e in leak.evidence] == [5, 175]
    assert leak.evidence[1].value - leak.evidence[0].value > 10 * MB
    (stats,) = verdict.phases
    assert (stats.phase, stats.metric, stats.batches, stats.judged) == (
        "validation",
        "allocated",
        N,
        171,
    )
    assert stats.status == "FAIL" and stats.budget == 5_000_000
    assert stats.slope == pytest.approx(64 * KB, rel=0.01)
    assert stats.p_value < 1e-15  # tested on the stride's readings: 41 of the 176
    growth = [c for c in verdict.checks if c.rule == "max_growth"]
    assert [(c.scope, c.status) for c in growth] == [("validation epoch 0", "FAIL")]


def test_clean_series_passes_and_is_described():
    verdict = judge(loop(noisy(0.0)), Rules(max_growth="1MB", max_peak="100MB"))
    assert verdict.status == "PASS" and verdict.passed
    assert verdict.findings == ()
    (stats,) = verdict.phases
    assert stats.status == "PASS"
    assert abs(stats.growth) < 64 * KB and abs(stats.slope) < 100
    assert stats.noise == pytest.approx(2 * KB, rel=0.3)
    assert stats.start == pytest.approx(BASE, abs=16 * KB) and stats.peak_rise < 64 * KB
    assert {c.rule: c.status for c in verdict.checks} == {
        "max_growth": "PASS",
        "max_peak": "PASS",
        "oom": "PASS",
    }


def test_no_growth_rule_means_no_leak_check_but_statistics():
    verdict = judge(loop(noisy(64 * KB)))
    assert verdict.status == "PASS"
    assert verdict.phases[0].slope == pytest.approx(64 * KB, rel=0.01)
    assert [c.rule for c in verdict.checks] == ["oom"]


def test_growth_below_the_budget_is_not_a_leak():
    verdict = judge(loop(noisy(16 * KB)), Rules(max_growth="5MB"))
    assert verdict.status == "PASS"
    assert 2.5 * MB < verdict.phases[0].growth < 5_000_000


def test_a_single_huge_batch_is_a_peak_not_a_leak():
    values = noisy(0.0)
    peak = [None] * N
    peak[80] = values[80] + 31 * 60 * MB  # a batch of 32 where 1 was expected
    values[80] += 31 * 60 * MB  # and still held when its checkpoint was read
    verdict = judge(loop(values, peak=peak), Rules(max_growth="1MB", max_peak="500MB"))
    assert verdict.status == "FAIL"
    assert kinds(verdict) == ["peak"]
    (finding,) = verdict.findings
    assert finding.severity == "P1" and finding.bytes == pytest.approx(31 * 60 * MB, rel=0.01)
    assert [(e.label, e.batch, e.metric) for e in finding.evidence] == [
        ("VALIDATION_START", None, "allocated"),
        ("VALIDATION_BATCH", 80, "peak"),
    ]
    assert verdict.phases[0].growth < 64 * KB


def test_peak_rises_are_read_against_rss_on_cpu():
    rss = noisy(0.0, base=400 * MB)
    samples = loop(noisy(0.0, base=50 * MB), rss=rss, peak=rss + 10 * MB)
    samples[0] = replace(samples[0], metrics={"allocated": 50 * MB, "rss": int(rss[0])})
    verdict = judge(samples, Rules(max_peak="8MB"))
    assert kinds(verdict) == ["peak"]
    assert verdict.findings[0].bytes == pytest.approx(10 * MB, abs=64 * KB)
    assert [e.metric for e in verdict.findings[0].evidence] == ["rss", "peak"]


def test_a_persistent_step_after_warmup_counts_as_growth():
    values = noisy(0.0)
    values[90:] += 20 * MB
    verdict = judge(loop(values), Rules(max_growth="10MB"))
    assert kinds(verdict) == ["leak"]
    assert verdict.findings[0].bytes == pytest.approx(20 * MB, abs=64 * KB)


def test_warmup_batches_are_excluded():
    values = noisy(0.0)
    values[:20] -= np.linspace(40 * MB, 2 * MB, 20)  # allocator warm-up
    rules = Rules(max_growth="5MB", warmup=20)
    assert judge(loop(values), rules).status == "PASS"
    assert judge(loop(values), rules).phases[0].judged == N - 20
    # without the warm-up, growth that stops early and stays flat is a bounded cache
    assert kinds(judge(loop(values), replace(rules, warmup=0))) == ["cache"]
    assert kinds(judge(loop(values), replace(rules, warmup=0, cache_is_leak=True))) == ["leak"]


def test_too_few_batches_after_warmup_is_an_error_not_a_pass():
    verdict = judge(loop(noisy(10 * MB, n=9)), Rules(max_growth="1MB", warmup=5))
    assert verdict.status == "ERROR"
    assert verdict.error.startswith("max_growth judged nothing: 4 batches after 5 warm-up")
    (check,) = [c for c in verdict.checks if c.rule == "max_growth"]
    assert check.status == "SKIP" and "too few" in check.details
    assert verdict.phases[0].status == "SKIP"
    allowed = Rules(max_growth="1MB", warmup=5, allow_unjudged=True)
    assert judge(loop(noisy(10 * MB, n=9)), allowed).status == "PASS"


def test_a_misspelt_phase_is_a_configuration_error_naming_the_phases_seen_and_the_likely_one():
    leak = loop(np.arange(N) * MB, phase="training") + loop(np.arange(N) * MB)
    verdict = judge(leak, Rules(phase="validaton", max_growth="1MB"))
    assert verdict.status == "ERROR" and not verdict.findings
    assert verdict.error_kind == "configuration"
    assert verdict.error == (
        "the rule `phase='validaton'` matched no checkpoint; phases seen: training, validation; "
        "did you mean 'validation'?"
    )
    far = judge(leak, Rules(phase="test", max_growth="1MB"))
    assert far.error.endswith("phases seen: training, validation")
    assert judge(leak, Rules(phase="validation", max_growth="1MB")).status == "FAIL"


def test_rules_over_a_run_without_checkpoints_are_a_configuration_error_with_the_fix():
    ends = [Sample("TEST_START", "test", collected=True), Sample("TEST_END", "test")]
    verdict = judge(ends, Rules(max_growth="1MB"))
    assert verdict.status == "ERROR" and verdict.error_kind == "configuration"
    assert verdict.error == (
        "the rule `max_growth='1MB'` matched no checkpoint; no checkpoints at all: pass "
        "`memtrace` to the trainer as a callback or call `memtrace.checkpoint`"
    )
    phase = judge(ends, Rules(phase="validation", max_growth="1MB")).error
    assert phase.startswith(
        "the rule `phase='validation'` matched no checkpoint; phases seen: none"
    )
    assert phase.endswith("call `memtrace.checkpoint`")
    assert judge(ends[:1], Rules()).status == "PASS"


def test_a_loop_shorter_than_its_warm_up_is_unjudged_not_a_configuration_mistake():
    verdict = judge(loop(np.zeros(4)), Rules(max_growth="1MB", warmup=50))
    assert verdict.status == "ERROR" and verdict.error_kind == "unjudged"
    assert verdict.error.startswith("max_growth judged nothing: ")


# -- the re-check after the loop ------------------------------------------------------------------


def with_after(samples, *extra):
    """``samples`` followed by ``(label, phase, value, collected)`` checkpoints."""
    after = [
        Sample(label, phase, 0, None, 500.0, {"allocated": int(v)}, collected)
        for label, phase, v, collected in extra
    ]
    return samples + after


def test_memory_freed_when_the_phase_ends_is_still_a_leak_inside_it():
    samples = loop(noisy(64 * KB), end=BASE)
    samples = with_after(samples, ("EPOCH_END", "epoch", BASE, True))
    verdict = judge(samples, Rules(max_growth="5MB"))
    (leak,) = verdict.findings
    assert leak.kind == "leak" and "released when the phase ended" in leak.message
    assert leak.evidence[-1].label == "VALIDATION_END"


def test_memory_still_held_after_the_phase_is_not_said_released():
    grown = 40 * KB * 170  # 6.6 MiB after warm-up; the END gives back a sixth of it
    samples = loop(noisy(40 * KB), end=BASE + 5 * grown // 6 - 2 * MB)
    (leak,) = judge(samples, Rules(max_growth="5MB")).findings
    assert leak.kind == "leak" and "released" not in leak.message
    assert "no collected re-check after the loop" in leak.message
    freed = loop(noisy(40 * KB), end=BASE + grown // 3)  # two thirds given back
    (leak,) = judge(freed, Rules(max_growth="5MB")).findings
    assert "released when the phase ended" in leak.message


def test_growth_only_collection_gives_back_is_not_a_leak():
    samples = with_after(loop(noisy(64 * KB)), ("AFTER_GC", "validation", BASE + 100 * KB, True))
    verdict = judge(samples, Rules(max_growth="5MB"))
    assert verdict.status == "PASS" and verdict.findings == ()
    (check,) = [c for c in verdict.checks if c.rule == "max_growth"]
    assert check.status == "PASS" and "reclaimed by collection" in check.details


def test_memory_freed_after_the_phase_by_other_code_does_not_clear_a_leak():
    samples = with_after(loop(noisy(64 * KB)), ("TEST_END", "test", BASE, True))
    (leak,) = judge(samples, Rules(max_growth="5MB")).findings
    assert leak.kind == "leak" and "no collected re-check" in leak.message


def test_a_run_that_stopped_inside_the_loop_says_nothing_of_a_re_check():
    stopped = loop(noisy(64 * KB))[:-1]  # no VALIDATION_END: the run ended in the loop
    (leak,) = judge(stopped, Rules(max_growth="5MB")).findings
    assert leak.outcome == "unchecked" and "re-check" not in leak.message
    (leak,) = judge(loop(noisy(64 * KB)), Rules(max_growth="5MB")).findings
    assert leak.message.endswith("; no collected re-check after the loop")


def test_growth_still_held_after_collection_is_a_retained_leak():
    samples = with_after(loop(noisy(64 * KB)), ("AFTER_GC", "validation", BASE + 11 * MB, True))
    (leak,) = judge(samples, Rules(max_growth="5MB")).findings
    assert "retained after collection (AFTER_GC" in leak.message
    assert leak.evidence[-1].collected


def test_collection_after_the_next_loop_started_is_not_a_recheck():
    samples = loop(noisy(64 * KB)) + loop(noisy(0.0), phase="training", epoch=1)
    samples.append(Sample("SESSION_END", "session", 1, None, 900.0, {"allocated": BASE}, True))
    verdict = judge(samples, Rules(max_growth="5MB"))
    assert kinds(verdict) == ["leak"]
    assert "no collected re-check" in verdict.findings[0].message


# -- epochs, drift, teardown ----------------------------------------------------------------------


def epochs(slopes, *, drift=0):
    out = [Sample("SESSION_START", "session", 0, None, 0.0, {"allocated": BASE})]
    for epoch, slope in enumerate(slopes):
        level = BASE + epoch * drift
        out.append(Sample("EPOCH_START", "training", epoch, None, 0.0, {"allocated": level}))
        out += loop(noisy(slope, seed=epoch, base=level), epoch=epoch)
    out.append(Sample("SESSION_END", "session", len(slopes) - 1, None, 0.0, {"allocated": BASE}))
    return out


def test_each_epoch_is_judged_and_the_worst_is_reported():
    verdict = judge(epochs([0, 64 * KB, 128 * KB]), Rules(max_growth="5MB"))
    (leak,) = verdict.findings
    assert leak.epoch == 2 and leak.slope == pytest.approx(128 * KB, rel=0.01)
    assert leak.message.endswith("(2 of 3 epochs)")
    assert [p.status for p in verdict.phases] == ["PASS", "FAIL", "FAIL"]


def test_drift_of_a_checkpoint_across_epochs():
    samples = epochs([0, 0, 0], drift=30 * MB)
    verdict = judge(samples, Rules(max_drift="50MB", warmup_epochs=0))
    (drift,) = verdict.findings
    assert (drift.kind, drift.severity, drift.epoch) == ("drift", "P2", 2)
    assert drift.bytes == pytest.approx(60 * MB, abs=16 * KB)
    assert [e.epoch for e in drift.evidence] == [0, 2]
    assert drift.evidence[0].label == drift.evidence[1].label
    assert drift.message.endswith("(3 labels drift)")  # EPOCH_START, VALIDATION_START and _END
    by_label = {c.scope: c for c in verdict.checks if c.rule == "max_drift"}
    assert by_label["EPOCH_START"].status == "FAIL"
    assert by_label["EPOCH_START"].measured == 60 * MB
    assert verdict.status == "FAIL"
    assert judge(samples, Rules(max_drift="100MB", warmup_epochs=0)).status == "PASS"


def test_drift_leaves_out_the_first_epoch_by_default():
    samples = epochs([0, 0, 0], drift=30 * MB)
    assert judge(samples, Rules(max_drift="50MB")).status == "PASS"  # epoch 2 vs 1: +30MB
    assert judge(samples, Rules(max_drift="20MB")).of_kind("drift")[0].evidence[0].epoch == 1
    two = [s for s in samples if s.epoch != 2]
    verdict = judge(two, Rules(max_drift="1MB"))
    (check,) = [c for c in verdict.checks if c.rule == "max_drift"]
    said = "1 epoch left to judge after warmup_epochs=1 (epochs seen: 0, 1); drift compares two"
    assert check.status == "SKIP" and check.details.startswith(said)
    assert (
        verdict.status == "ERROR" and verdict.error == f"max_drift judged nothing: {check.details}"
    )


def test_teardown_compares_the_collected_end_with_the_session_start():
    samples = epochs([0])
    held = Sample("SESSION_END", "session", 0, None, 9.0, {"allocated": BASE + 815 * MB}, True)
    verdict = judge([*samples, held], Rules(teardown="10MB"))
    (finding,) = verdict.findings
    assert (finding.kind, finding.severity, finding.bytes) == ("teardown", "P0", 815 * MB)
    assert [e.label for e in finding.evidence] == ["SESSION_START", "SESSION_END"]
    freed = replace(held, metrics={"allocated": BASE + MB})
    assert judge([*samples, freed], Rules(teardown="10MB")).status == "PASS"


def test_teardown_understands_a_recorders_session_phase_labels():
    samples = [
        Sample("session START", "session", None, None, 0.0, {"allocated": BASE}),
        *loop(noisy(0.0, n=20)),
        Sample("session END", "session", None, None, 9.0, {"allocated": BASE + 50 * MB}),
        Sample("after gc", None, None, None, 9.5, {"allocated": BASE + 20 * MB}, collected=True),
    ]
    (finding,) = judge(samples, Rules(teardown="10MB")).findings
    assert finding.bytes == 20 * MB
    assert [e.label for e in finding.evidence] == ["session START", "after gc"]


def test_teardown_without_a_collected_sample_is_an_error_not_a_pass():
    verdict = judge(epochs([0]), Rules(teardown="10MB"))
    (check,) = [c for c in verdict.checks if c.rule == "teardown"]
    assert check.status == "SKIP" and verdict.status == "ERROR"
    assert verdict.error == "teardown judged nothing: no collected sample after the session end"


# -- OOM, errors, fragmentation -------------------------------------------------------------------


def test_an_oom_sample_is_a_finding_not_a_crash():
    samples = loop(noisy(0.0, n=3))
    note = "CUDA out of memory. Tried to allocate 2.00 GiB\nmore"
    reading = {"allocated": BASE, "peak": 4 * 2**30}
    samples.insert(2, Sample("OOM", "validation", 0, 1, 2.5, reading, note=note))
    verdict = judge(samples, Rules(max_growth="1MB"))
    assert verdict.status == "FAIL"
    (oom,) = verdict.findings
    assert (oom.kind, oom.severity, oom.phase, oom.bytes) == ("oom", "P0", "validation", 4 * 2**30)
    assert oom.message.endswith("Tried to allocate 2.00 GiB")
    assert oom.evidence[0].batch == 1


def test_each_failure_of_a_batch_is_one_reading_of_its_oom_finding():
    """A capacity checkpoint and the OOM the trainer reports for it are one failure; the batch
    retried at half the size fails again: two failures, two readings."""
    over = "emulated capacity 512.0MiB exceeded at 'VALIDATION_BATCH': 600.0MiB on cpu"
    failure = [
        Sample(
            "VALIDATION_BATCH", "validation", 0, 3, 2.0, {"allocated": BASE}, note=over, event="OOM"
        ),
        Sample("OOM", "validation", 0, 3, 2.1, {"allocated": BASE}, note=over),
    ]
    samples = loop(noisy(0.0, n=3))
    samples[3:3] = failure * 2
    (oom,) = judge(samples, Rules()).findings
    assert [(e.label, e.batch) for e in oom.evidence] == [("VALIDATION_BATCH", 3)] * 2
    reported = [replace(s, label="OOM") for s in failure]  # two OOMs the trainer reported
    samples[3:7] = reported
    (oom,) = judge(samples, Rules()).findings
    assert [e.label for e in oom.evidence] == ["OOM", "OOM"]


@pytest.mark.parametrize(
    "note",
    ["RuntimeError: out of memory", "emulated capacity 4096.0MB exceeded at 'B': 4100.2MB on cpu"],
)
def test_an_oom_is_the_samples_event_never_its_notes_text(note):
    """A user's note that says the capacity was exceeded is text: only the sample's event (an
    emulated capacity the recorder found exceeded, an ``OOM`` label) makes an OOM."""
    said = Sample("VALIDATION_BATCH", "validation", 0, 3, note=note)
    assert not judge([said]).findings
    assert kinds(judge([replace(said, event="OOM")])) == ["oom"]
    assert kinds(judge([replace(said, label="OOM", event=None)])) == ["oom"]


class TrainingOOM(RuntimeError):
    pass


def test_an_oom_error_fails_and_any_other_error_is_an_error():
    samples = loop(noisy(0.0, n=20))
    oom = judge(samples, error=TrainingOOM("Training OOM after 0 retries"))
    assert oom.status == "FAIL" and kinds(oom) == ["oom"] and oom.error is None
    assert judge(samples, error=MemoryError()).status == "FAIL"
    crashed = judge(samples, Rules(max_growth="1MB"), error=ValueError("bad shape\ntrace"))
    assert crashed.status == "ERROR" and crashed.error == "ValueError: bad shape"
    assert [c.status for c in crashed.checks if c.rule == "error"] == ["ERROR"]
    assert judge(samples, error="segfault in worker").status == "ERROR"


def test_fragmentation_is_a_warning_that_does_not_fail():
    allocated = noisy(0.0)
    reserved = allocated + 100 * MB + np.minimum(np.arange(N), 120) * 2 * MB
    verdict = judge(loop(allocated, reserved=reserved), Rules(max_growth="5MB"))
    assert verdict.status == "PASS"
    (warning,) = verdict.findings
    assert (warning.kind, warning.severity, warning.blocking) == ("fragmentation", "P2", False)
    assert warning.bytes > 200 * MB
    assert verdict.phases[0].status == "WARN"
    flat = judge(loop(allocated, reserved=allocated + 100 * MB), Rules(max_growth="5MB"))
    assert flat.findings == () and "fragmentation" in {c.rule for c in flat.checks}


# -- metrics, phases, inputs ----------------------------------------------------------------------


def test_metric_falls_back_to_rss_when_a_sample_lacks_it():
    rss = noisy(64 * KB)
    samples = loop(rss, metric="rss")
    samples[40] = replace(samples[40], metrics={"rss": int(rss[39]), "allocated": 1})
    verdict = judge(samples, Rules(max_growth="5MB"))
    assert verdict.phases[0].metric == "rss"
    assert kinds(verdict) == ["leak"] and verdict.findings[0].evidence[0].metric == "rss"


def test_a_metric_read_nowhere_is_skipped():
    verdict = judge(loop(noisy(0.0), metric="device_used"), Rules(max_growth="1MB"))
    assert verdict.phases[0].status == "SKIP" and verdict.phases[0].metric is None


def test_phase_selection():
    samples = loop(noisy(64 * KB), phase="training") + loop(noisy(0.0))
    only_val = judge(samples, Rules(phase="validation", max_growth="5MB"))
    assert only_val.status == "PASS" and [p.phase for p in only_val.phases] == ["validation"]
    both = judge(samples, Rules(phase=["training", "validation"], max_growth="5MB"))
    assert kinds(both) == ["leak"] and both.findings[0].phase == "training"
    missing = judge(samples, Rules(phase="test", max_growth="5MB"))
    assert (missing.checks[0].rule, missing.checks[0].status) == ("configuration", "SKIP")


def test_rules_parse_sizes_and_accept_mappings():
    rules = Rules(phase="validation", max_growth="50MB", max_peak="512KiB", teardown=0)
    assert (rules.phase, rules.max_growth, rules.max_peak, rules.teardown) == (
        ("validation",),
        50_000_000,
        512 * 1024,
        0,
    )
    assert Rules.from_dict(rules.to_dict()) == rules
    assert judge(loop(noisy(64 * KB)), {"max_growth": "5MB"}).status == "FAIL"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_growth": "fifty"}, "max_growth"),
        ({"max_peak": -1}, "max_peak"),
        ({"teardown": 1.5}, "teardown"),
        ({"warmup": -1}, "warmup"),
        ({"warmup": True}, "warmup"),
        ({"metric": ""}, "metric"),
        ({"phase": []}, "phase"),
        ({"phase": ["validation", ""]}, "phase"),
        ({"phase": 3}, "phase"),
        ({"allow_unjudged": "yes"}, "allow_unjudged"),
        ({"custom": {"mine": object()}}, "custom"),
    ],
)
def test_bad_rules_raise_clear_errors(kwargs, match):
    """Wrong types and wrong values alike are one error: a BadArgument (still a ValueError)."""
    with pytest.raises(BadArgument, match=match) as refused:
        Rules(**kwargs)
    assert isinstance(refused.value, ValueError)


def test_bad_rules_carry_the_field_as_an_attribute():
    with pytest.raises(BadInput) as bad:
        Rules(max_growth="lots")
    assert bad.value.field == "Rules.max_growth" and "cannot read 'lots'" in bad.value.problem
    assert str(bad.value).startswith("Rules.max_growth: cannot read 'lots' as a size")
    with pytest.raises(BadInput) as bad:
        parse_option("warmup", "five")
    assert (bad.value.field, bad.value.problem) == ("warmup", "expected a whole number, got 'five'")
    with pytest.raises(BadInput) as bad:
        Verdict.from_dict({"schema_version": 2, "status": "PASS", "findings": 3})
    assert bad.value.field == "findings"


def test_unknown_rules_are_named():
    with pytest.raises(BadArgument, match="max_grwoth"):
        judge([], {"max_grwoth": "5MB"})


# -- registered rules that cannot judge -----------------------------------------------------------


def _recurse(ctx, option):
    return _recurse(ctx, option)


def _bad_check(ctx, option):
    ctx.check("broken", "run", "MAYBE", "not a status")
    return []


BROKEN_RULES = {
    "raises": (lambda ctx, option: 1 / 0, "ZeroDivisionError"),
    "returns None": (lambda ctx, option: None, "returned NoneType"),
    "returns a list of numbers": (lambda ctx, option: [1, 2], "returned a int among"),
    "returns a string": (lambda ctx, option: "leak", "returned str"),
    "wrong signature": (lambda ctx: [], "TypeError"),
    "recurses": (_recurse, "RecursionError"),
    "exits": (lambda ctx, option: sys.exit(3), "SystemExit: 3"),
    "bad check status": (_bad_check, "'MAYBE' is not a valid CheckStatus"),
    "bad finding kind": (
        lambda ctx, option: [Finding("bogus", None, None, 1, "x")],
        "Finding.kind: expected one of leak, peak",
    ),
    "finding bytes not whole": (
        lambda ctx, option: [Finding("leak", None, None, 1.5, "x")],
        "Finding.bytes: expected a whole number, got 1.5",
    ),
    "finding slope not finite": (
        lambda ctx, option: [Finding("leak", None, None, 1, "x", float("nan"))],
        "Finding.slope: expected a finite number, got nan",
    ),
}


@pytest.fixture
def broken_rule():
    yield "broken"
    unregister_rule("broken")


@pytest.mark.parametrize("scope", ["run", "phase"])
@pytest.mark.parametrize("case", sorted(BROKEN_RULES))
def test_a_rule_that_cannot_judge_is_an_error_naming_it_and_the_rest_is_judged(
    broken_rule, case, scope
):
    function, error = BROKEN_RULES[case]
    if scope == "phase":
        run_rule = function
        function = lambda ctx, group, option: run_rule(ctx, option)  # noqa: E731
    register_rule(broken_rule, function, scope=scope)
    rules = Rules(max_growth="1MB", warmup=0, custom={broken_rule: "1MB"})
    verdict = judge(loop(noisy(64 * KB, n=40)), rules)
    assert verdict.status == "ERROR"
    assert "rule 'broken' could not judge: " in verdict.error and error in verdict.error
    assert [c.status for c in verdict.checks if c.rule == "broken"][-1] == "ERROR"
    assert kinds(verdict) == ["leak"]


def test_a_rule_option_no_registered_rule_reads_is_an_error_naming_it():
    # A name no test registers (another module registers ``back_to_start`` at import).
    option = "never_registered_option"
    verdict = judge(loop(noisy(n=40)), Rules(max_growth="1MB", custom={option: "1MB"}))
    assert verdict.status == "ERROR"
    assert f"'{option}' is read by no registered rule" in verdict.error
    (check,) = [c for c in verdict.checks if c.rule == option]
    assert check.status == "ERROR"


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (10**400, "an integer beyond a float's range"),
        (float("nan"), "expected a finite number, got nan"),
        ([1, float("inf")], "expected a finite number, got inf"),
        ({"at": object()}, "expected text, a number, true, false, null, a list or an object"),
        ({1: "x"}, "expected an object with text keys"),
    ],
)
def test_a_rule_option_that_json_would_not_give_back_is_refused(value, problem):
    with pytest.raises(BadInput) as bad:
        Rules(custom={"mine": value})
    assert bad.value.field.startswith("Rules.custom.mine") and problem in bad.value.problem


def test_statuses_and_severities_know_their_order():
    assert Status.worst(["PASS", "ERROR", "FAIL"]) == Status.ERROR
    assert CheckStatus.worst([], CheckStatus.PASS) == CheckStatus.PASS
    assert CheckStatus.worst(["SKIP", "PASS"]) == CheckStatus.PASS
    assert CheckStatus.worst(["PASS", "WARN", "SKIP"]) == CheckStatus.WARN
    assert Severity.P0.rank > Severity.P1.rank > Severity.P2.rank
    with pytest.raises(ValueError):
        Status.worst([])


# -- the verdict as JSON --------------------------------------------------------------------------


def test_verdict_round_trips_through_json():
    samples = epochs([0, 64 * KB], drift=30 * MB)
    samples.append(
        Sample("OOM", "validation", 1, 7, 0.0, {"allocated": BASE}, note="out of memory")
    )
    rules = Rules(max_growth="5MB", max_drift="10MB", max_peak="1GB", warmup_epochs=0)
    verdict = judge(samples, rules)
    data = json.loads(json.dumps(verdict.to_dict()))
    assert next(iter(data)) == "schema_version" and data["schema_version"] == SCHEMA_VERSION
    assert {f["kind"] for f in data["findings"]} == {"leak", "drift", "oom"}
    assert Verdict.from_dict(data) == verdict
    leak = verdict.of_kind("leak")[0]
    assert Finding.from_dict(leak.to_dict()) == leak


def test_verdicts_from_a_newer_schema_are_refused():
    with pytest.raises(ValueError, match="schema_version"):
        Verdict.from_dict({"schema_version": SCHEMA_VERSION + 1, "status": "PASS"})


def test_public_names_are_exported():
    assert harness.judge is judge and harness.Rules is Rules and harness.Verdict is Verdict


# -- properties -----------------------------------------------------------------------------------

NOISE_FLOOR = 10 * KB
BUDGET = 128 * KB  # comfortably above what a +-10 KB jitter can fake as a trend


@st.composite
def noise(draw, n):
    """Jitter within +-NOISE_FLOOR in an arbitrary shape, a few isolated spikes of any height,
    and a noisy warm-up."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    amplitude = draw(st.integers(0, NOISE_FLOOR))
    shape = draw(
        st.sampled_from(["uniform", "normal", "student", "ascending", "descending", "step", "saw"])
    )
    i = np.arange(n)
    jitter = {
        "uniform": lambda: rng.uniform(-1, 1, n),
        "normal": lambda: np.clip(rng.normal(0, 0.4, n), -1, 1),
        "student": lambda: np.clip(rng.standard_t(2, n) * 0.2, -1, 1),
        "ascending": lambda: np.linspace(-1, 1, n),
        "descending": lambda: np.linspace(1, -1, n),
        "step": lambda: np.where(i < n // 2, -1.0, 1.0),
        "saw": lambda: (i % 17) / 8 - 1,
    }[shape]() * amplitude
    spikes = np.zeros(n)
    count = int(n * draw(st.floats(0, 0.03)))
    at = rng.choice(np.arange(0, n, 2), size=min(count, n // 2), replace=False)
    spikes[at] = rng.choice([-1, 1], size=len(at)) * draw(st.integers(0, 64 * MB))
    spikes[:5] = rng.uniform(-8 * MB, 8 * MB, 5)  # allocator warm-up, excluded by warmup=5
    return np.round(jitter + spikes)


@settings(max_examples=60, deadline=None)
@given(st.data(), st.integers(25, 400))
def test_noise_is_never_a_leak(data, n):
    values = BASE + data.draw(noise(n))
    verdict = judge(loop(values), Rules(max_growth=BUDGET))
    assert verdict.of_kind("leak") == []


@settings(max_examples=60, deadline=None)
@given(st.data(), st.integers(25, 400), st.floats(2.0, 20.0))
def test_a_leak_twice_the_budget_is_always_found(data, n, factor):
    slope = factor * BUDGET / (n - 6)
    values = BASE + slope * np.arange(n) + data.draw(noise(n))
    verdict = judge(loop(values), Rules(max_growth=BUDGET))
    (leak,) = verdict.of_kind("leak")
    assert leak.slope == pytest.approx(slope, rel=0.5)


def essence(verdict):
    """Everything a verdict decides, leaving out absolute readings."""
    return (
        verdict.status,
        [(f.kind, f.phase, f.epoch, f.bytes, f.slope) for f in verdict.findings],
        [(c.rule, c.scope, c.status, c.measured) for c in verdict.checks],
        [(p.status, p.growth, p.slope, p.p_value, p.peak_rise) for p in verdict.phases],
    )


@settings(max_examples=40, deadline=None)
@given(st.data(), st.integers(0, 10**12), st.sampled_from([0.0, 512.0, 64 * KB]))
def test_adding_a_constant_changes_nothing(data, shift, slope):
    values = BASE + slope * np.arange(N) + data.draw(noise(N))
    values[60] += 700 * MB
    samples = epochs([0]) + loop(values, epoch=1)
    samples.append(Sample("SESSION_END", "session", 1, None, 0.0, {"allocated": BASE + MB}, True))
    rules = Rules(max_growth="5MB", max_peak="500MB", max_drift="1MB", teardown="2MB")
    shifted = [replace(s, metrics={k: v + shift for k, v in s.metrics.items()}) for s in samples]
    assert essence(judge(shifted, rules)) == essence(judge(samples, rules))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-1e9, 1e9, allow_nan=False), min_size=N + 2, max_size=N + 2))
def test_the_verdict_ignores_time(times):
    samples = loop(noisy(64 * KB))
    retimed = [replace(s, time=t) for s, t in zip(samples, times, strict=True)]
    rules = Rules(max_growth="5MB", max_peak="1MB")
    assert judge(retimed, rules).to_dict() == judge(samples, rules).to_dict()


def test_detection_limit_with_malloc_like_noise():
    """The measured detection limit. Noise as malloc's bytes in use show it: 0.5 KB jitter, a
    random walk of 250 B per batch, an 8 KB tensor still alive at 5% of the readings. A 64 KiB
    budget over 176 batches never flags such a clean loop and finds a 512 B/batch leak."""
    found = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        walk = np.cumsum(rng.normal(0, 250, N)) + rng.normal(0, 512, N)
        walk += (rng.random(N) < 0.05) * 8240
        clean = judge(loop(BASE + np.round(walk)), Rules(max_growth=64 * KB))
        assert clean.of_kind("leak") == []
        leaking = judge(loop(BASE + np.round(walk + 512 * np.arange(N))), Rules(max_growth=64 * KB))
        found += bool(leaking.of_kind("leak"))
    assert found >= 36


@pytest.mark.parametrize("warmup", [-1, 1.5, True, "5"])
def test_a_bad_count_is_the_same_error_from_rules_and_attribution(warmup):
    from harness._attribution.phase import PhaseAttribution

    with pytest.raises(BadArgument) as from_rules:
        Rules(warmup=warmup)
    with pytest.raises(BadArgument) as from_attribution:
        PhaseAttribution(warmup=warmup)
    assert from_rules.value.problem == from_attribution.value.problem
    assert from_rules.value.problem == f"expected a whole number >= 0, got {warmup!r}"
    # bad input for every front end, and API misuse at the call
    assert isinstance(from_rules.value, BadInput) and isinstance(from_rules.value, TypeError)


def test_phases_read_once_as_a_tuple_from_any_front_end():
    assert Rules(phase="validation").phase == ("validation",)
    assert Rules.from_dict({"phase": ["train", "validation"]}).phase == ("train", "validation")
    stored = Verdict(status=Status.PASS, rules=Rules(phase=["train"])).to_dict()
    assert stored["rules"]["phase"] == ["train"]
    assert Verdict.from_dict(stored).rules.phase == ("train",)

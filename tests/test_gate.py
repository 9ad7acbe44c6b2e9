"""``compare_runs``: what the rules judged, compared between a base run and a new one."""

import json
from dataclasses import replace

import pytest
from test_report import HEADER, RULES, incident

from harness._report.run import Run
from harness._results.artifacts import compare_runs, run_document
from harness._rules.judging import judge

MB = 2**20
TEARDOWN = {**RULES, "teardown": "64MiB"}


def collected(samples):
    """The run's start and end readings taken after a collection (as the teardown rule needs),
    the run ending where it started."""
    end = samples[-1].metrics
    return [
        replace(s, collected=True, metrics=end) if s.label == "SESSION_START" else s
        for s in samples[:-1]
    ] + [replace(samples[-1], collected=True)]


def document(samples, rules=RULES):
    run = Run("run", {**HEADER, "run_id": "e" * 32}, samples, judge(samples, rules))
    return json.loads(json.dumps(run_document(run)))


def shifted(samples, *, offset_mb=0.0, growth=1.0, end_mb=0.0):
    """``samples`` with every reading raised by ``offset_mb``, the validation loop's rise scaled
    by ``growth``, and the run's last reading raised by ``end_mb`` more."""
    start = next(s for s in samples if s.label == "VALIDATION_BATCH").metrics["allocated"]
    out = []
    for i, s in enumerate(samples):
        value = s.metrics["allocated"]
        if s.label == "VALIDATION_BATCH":
            value = start + round((value - start) * growth)
        value += round(offset_mb * MB) + (round(end_mb * MB) if i == len(samples) - 1 else 0)
        out.append(replace(s, metrics={"allocated": value}))
    return out


def test_a_20_percent_growth_regresses_and_a_2_percent_wobble_does_not():
    base = document(incident())
    grown = compare_runs(base, document(shifted(incident(), growth=1.2)))
    assert grown.regressed and {c.item for c in grown.regressions} == {
        "validation epoch 0 growth",
        "validation peak rise",
        "validation epoch 0 slope",
    }
    growth = next(c for c in grown.regressions if c.item.endswith("growth"))
    assert growth.percent == pytest.approx(20.0, abs=0.5)
    wobble = compare_runs(base, document(shifted(incident(), growth=1.02)))
    assert not wobble.regressed and not wobble.regressions
    shrunk = compare_runs(document(shifted(incident(), growth=1.2)), base)
    assert not shrunk.regressed and len([c for c in shrunk.changes if c.improvement]) == 3


def test_a_peak_that_moves_to_another_epoch_is_not_a_regression_and_a_higher_one_is():
    """The gate once failed a clean run: its training peak rose 1.1 MiB in epoch 1 and fell
    1 MiB in epoch 0, the run's highest peak no higher than the baseline's."""

    def run(peaks):
        phases = [
            {
                "phase": "training",
                "epoch": e,
                "metric": "allocated",
                "peak_metric": "rss",
                "peak_rise": p * MB,
                "growth": 0.0,
                "slope": 0.0,
                "judged": 700,
            }
            for e, p in enumerate(peaks)
        ]
        return {"status": "PASS", "phases": phases, "checks": []}

    base = run([6.6, 2.1, 1.8])
    moved = compare_runs(base, run([5.7, 3.2, 1.8]))
    assert not moved.regressed
    higher = compare_runs(base, run([8.0, 2.1, 1.8]))
    assert [c.item for c in higher.regressions] == ["training peak rise"]


def test_levels_raised_by_what_ran_before_are_not_a_regression():
    base = document(incident())
    later = compare_runs(base, document(shifted(incident(), offset_mb=25.3)))
    assert not later.regressed and {c.delta for c in later.changes} == {0.0}
    assert all("START" not in c.item and "Epoch" not in c.item for c in later.changes)


def test_the_teardown_residue_is_compared():
    base = document(collected(incident()), TEARDOWN)
    kept = compare_runs(base, document(shifted(collected(incident()), end_mb=8), TEARDOWN))
    assert [c.item for c in kept.regressions] == ["session teardown residue"]
    assert kept.regressions[0].delta == 8 * MB and kept.regressions[0].percent is None


def test_a_small_number_has_a_noise_floor_and_no_percentage():
    flat = shifted(incident(), growth=0.001)
    grown = compare_runs(document(flat), document(shifted(incident(), growth=0.1)))
    growth = next(c for c in grown.changes if c.item == "validation epoch 0 growth")
    assert growth.regression and growth.percent is None and growth.base < MB
    assert not compare_runs(document(flat), document(shifted(incident(), growth=0.02))).regressed
    assert not compare_runs(
        document(flat), document(shifted(incident(), growth=0.1)), min_bytes=8 * MB
    ).regressed


def test_a_regressed_status_fails_and_nothing_in_common_proves_nothing():
    base = document(incident())
    passed = {**base, "status": "PASS"}
    assert compare_runs(passed, base).status_regressed and compare_runs(passed, base).regressed
    assert not compare_runs(base, passed).regressed
    nothing = compare_runs(base, {**base, "phases": [], "checks": []})
    assert nothing.nothing_compared and nothing.regressed and nothing.only_in_base > 0


def test_only_what_both_runs_judged_is_compared():
    base = document(incident())
    short = {**base, "phases": base["phases"][:1]}
    result = compare_runs(base, short)
    assert len(result.changes) == 3 and result.only_in_base == 0 and result.only_in_new == 0
    other = {**base, "phases": [{**p, "metric": "rss"} for p in base["phases"]]}
    assert compare_runs(base, other).nothing_compared

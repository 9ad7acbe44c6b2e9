"""The markdown report, the run's JSON document, the index and the comparison of two runs."""

import json
import re
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness._core.errors import BadInput
from harness._measure.sample import Sample
from harness._report.chart import CHART_POINTS, memory_chart
from harness._report.ranks import MergedRun, RankRun
from harness._report.run import Run
from harness._report.sections import render_report
from harness._results.artifacts import (
    compare_runs,
    load_run_document,
    run_document,
    save_run,
    write_index,
)
from harness._rules.judging import judge
from harness._verdict.model import SCHEMA_VERSION, Evidence, Finding, Verdict
from harness._verdict.options import Rules, judged_options

MB = 2**20
SECTIONS = [
    "# Memory report: ",
    "## Executive Summary",
    "## Configuration",
    "## Memory Profile",
    "## Memory Over the Run",
    "## Issues Found",
    "## Memory Analysis",
    "## Test Results Summary",
    "## Final Verdict",
    "## Logs",
]
HEADER = {
    "leakgate_timeline": 1,
    "leakgate": "0.1.0",
    "torch": "2.13.0",
    "python": "3.11.7",
    "probe": "cuda:0",
    "primary": "allocated",
    "device": "Tesla T4",
    "capacity": 4096 * MB,
    "capacity_emulated": False,
    "started": 1_700_000_000.0,
    "config": {"batch_size": 1, "validation_batch_size": 1, "epochs": 1, "lr": 0.001},
    "meta": {"train_samples": 704, "val_samples": 176, "faults": ["val-attention-cache"]},
}
RULES = {"phase": "validation", "max_growth": "20MiB", "warmup": 5}
HOLDER = {
    "path": "Trainer._attn_cache",
    "container": "list",
    "items": 176,
    "bytes": 2_400_000,
    "phase": "validation",
    "sites": ["tft/faults.py:42"],
}


def at(mb, label, phase, epoch=0, batch=None, **extra):
    return Sample(label, phase, epoch, batch, 1.0, {"allocated": round(mb * MB)}, **extra)


def incident(val_batches=40, *, oom=False):
    """One epoch: training flat at 1611MB, validation growing 1MB per batch (or dying)."""
    samples = [
        at(1291, "SESSION_START", "session", epoch=None),
        at(1291, "EPOCH_START", "training"),
        *(at(1611, "TRAIN_BATCH", "training", batch=b) for b in range(20)),
        at(1611, "AFTER_TRAINING", "training"),
        at(1611, "BEFORE_VALIDATION", "validation"),
        at(1611, "VALIDATION_START", "validation"),
        *(at(1611 + b, "VALIDATION_BATCH", "validation", batch=b) for b in range(val_batches)),
    ]
    if oom:
        samples.append(
            at(4000, "OOM", "validation", batch=val_batches, note="CUDA out of memory. Tried")
        )
        return samples
    return [
        *samples,
        at(1611 + val_batches, "VALIDATION_END", "validation"),
        at(1611, "AFTER_VALIDATION", "validation"),
        at(1611, "EPOCH_END", "epoch"),
        at(1611, "SESSION_END", "session", epoch=None),
    ]


def run_of(samples, rules=RULES, header=HEADER, **kwargs):
    verdict = judge(samples, rules)
    return Run("incident", header, samples, verdict, **kwargs)


def section(text, title):
    body = text.split(f"## {title}\n", 1)[1]
    return body.split("\n## ", 1)[0]


def test_every_section_in_order_with_the_numbers_of_a_constructed_timeline():
    run = run_of(
        incident(),
        title="TFT incident",
        holders=[HOLDER],
        timeline="x.jsonl",
        verdict_file="x.json",
    )
    text = render_report(run)
    positions = [text.index(s) for s in SECTIONS]
    assert positions == sorted(positions)
    assert text.startswith(
        "# Memory report: TFT incident\n\n2023-11-14 22:13 UTC · cuda:0: Tesla T4"
    )

    summary = section(text, "Executive Summary")
    assert "torch 2.13.0" in summary and "Python 3.11.7" in summary
    assert "1 of 1 epochs completed" in summary
    assert "**Verdict:** FAIL: 1 P0 finding in 2 checks" in summary
    assert re.search(
        r"Root cause:\*\* leak in validation epoch 0: .*held by `Trainer._attn_cache`"
        r" \(list, 176 items, 2.3MiB\)",
        summary,
    )

    config = section(text, "Configuration")
    for row in (
        "| Device | cuda:0: Tesla T4 |",
        "| Capacity | 4096.0MiB (real) |",
        "| Batch size | 1 |",
        "| Validation batch size | 1 |",
        "| Epochs | 1 |",
        "| Training samples | 704 |",
        "| Validation samples | 176 |",
        "| Faults | val-attention-cache |",
        "| Other settings | lr=0.001 |",
    ):
        assert row in config
    assert "| Probe / metric | cuda:0 / allocated" in config

    profile = section(text, "Memory Profile")
    assert "Epoch 0 AFTER_TRAINING:" in profile
    assert "1611.0MiB / 4096.0MiB (39.3% utilization)" in profile
    assert "SESSION_START:" in profile and "1291.0MiB / 4096.0MiB (31.5% utilization)" in profile
    batches = re.findall(r"Epoch 0 VALIDATION_BATCH #(\d+):", profile)
    assert batches == ["0", "10", "20", "30", "39"]  # first, every 10th, last
    assert re.findall(r"TRAIN_BATCH #(\d+):", profile) == ["0", "5", "10", "15", "19"]

    chart = section(text, "Memory Over the Run")
    assert "```mermaid\nxychart-beta" in chart
    line = re.search(r"line \[([^\]]*)\]", chart).group(1).split(", ")
    assert len(line) == len(run.samples) and line[0] == "1291.0" and "1650.0" in line

    issues = section(text, "Issues Found")
    assert "### Issue 1 (P0): Leak in validation epoch 0" in issues
    assert "Slope +1.0MiB/batch" in issues
    assert "Epoch 0 VALIDATION_BATCH #39 = 1650.0MiB (allocated)" in issues
    assert "**Suspected root cause:** Memory held by `Trainer._attn_cache`" in issues
    assert "`tft/faults.py:42`" in issues
    assert "**Recommended fix:** Clear `Trainer._attn_cache` inside the loop" in issues

    analysis = section(text, "Memory Analysis")
    row = next(r for r in analysis.splitlines() if r.startswith("| validation epoch 0"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == [
        "validation epoch 0",
        "allocated",
        "35/40",
        "1611.0MiB",
        "1611.0MiB",
        "+34.0MiB",
        "+40.0MiB",
        "+1.0MiB/batch",
        "20MiB",
        "**FAIL**",
    ]
    assert "| training epoch 0 | allocated | -/20 | 1291.0MiB | 1611.0MiB | +320.0MiB |" in analysis
    assert "- **Re-check:** Epoch 0 AFTER_VALIDATION read 1611.0MiB after the loop, against " in (
        issues
    )
    assert (
        "the loop's fitted start level of 1616.0MiB (`allocated`, read over the first 5 batches "
        "after the warm-up): -5.0MiB, within max_growth 20MiB, so the memory was released when "
        "the phase ended; inside the loop it grew +34.0MiB." in issues
    )

    results = section(text, "Test Results Summary")
    assert "| max_growth | validation epoch 0 | **FAIL** |" in results
    assert "| oom | run | PASS | 0 OOM events |" in results

    final = section(text, "Final Verdict")
    assert "**ALL CHECKS PASSING: NO**" in final
    assert "Completion: 1/2 checks passing (50%)" in final
    assert "Remaining: P0 leak in validation epoch 0" in final

    logs = section(text, "Logs")
    assert "[x.jsonl](x.jsonl)" in logs and "[x.json](x.json)" in logs


def test_the_rules_row_lists_every_judged_option_and_registered_rule_options():
    rules = {**RULES, "project_to": 704, "max_projected": "2MB", "cache_is_leak": True}
    run = run_of(incident(), rules)
    run = replace(run, verdict=replace(run.verdict, rules=Rules(**rules, custom={"mine": "1MB"})))
    row = next(r for r in render_report(run).splitlines() if r.startswith("| Rules |"))
    parts = [part.strip("| ") for part in row.removeprefix("| Rules |").split(" · ")]
    names = [part.split()[0] for part in parts]
    assert names == [*(o.name for o in judged_options()), "mine"]
    for shown in ("project_to 704", "max_projected 2MB (1.9MiB)", "cache_is_leak yes", "mine 1MB"):
        assert shown in parts
    assert "attribute" not in names and "explain" not in names


def test_an_error_the_run_did_not_raise_is_not_reported_as_raised():
    unread = render_report(run_of(incident(), {**RULES, "custom": {"gone": "1MB"}}))
    assert "ERROR: `rule option 'gone' is read by no registered rule" in unread
    assert "the run raised" not in unread
    raised = Run("incident", HEADER, incident(), judge(incident(), RULES, error="boom"))
    assert "ERROR: the run raised `boom`" in render_report(raised)


def test_the_re_check_line_shows_only_where_a_re_check_could_have_run():
    stopped = render_report(run_of(incident(30, oom=True)))  # out of memory inside the loop
    assert "Re-check:" not in stopped and "re-check" not in section(stopped, "Issues Found")
    unchecked = [s for s in incident() if s.label != "AFTER_VALIDATION"]
    unchecked = [replace(s, metrics={"allocated": 1651 * MB}) if s.label == "VALIDATION_END"
                 else s for s in unchecked]  # fmt: skip
    (leak,) = judge(unchecked, RULES).of_kind("leak")
    assert leak.outcome == "unchecked"
    assert "- **Re-check:** no collected reading after the loop" in render_report(run_of(unchecked))


def test_a_rank_holder_is_named_as_code_its_rank_as_text():
    holder = {**HOLDER, "path": "rank 0: test_ddp.KEPT", "rank": 0}
    text = render_report(run_of(incident(), holders=[holder]))
    assert "held by rank 0: `test_ddp.KEPT` (list, 176 items" in text
    assert "Clear rank 0: `test_ddp.KEPT` inside the loop" in text
    assert "`rank 0" not in text


def test_a_configuration_mistake_is_reported_as_one_with_its_fix():
    text = render_report(run_of(incident(), {**RULES, "phase": "validaton"}))
    said = (
        "the rule `phase='validaton'` matched no checkpoint; phases seen: training, validation; "
        "did you mean 'validation'?"
    )
    assert f"ERROR, a configuration mistake: {said}" in text
    issues = section(text, "Issues Found")
    assert issues.startswith(f"\n**Configuration mistake:** {said}.\n")
    assert "No finding: the verdict is ERROR for the reason above." in issues
    for wrong in ("raised", "None: no rule was broken"):
        assert wrong not in text


def test_thresholds_are_echoed_as_written_beside_their_binary_figure():
    run = run_of(incident(), {**RULES, "max_growth": "30MB", "max_peak": 50 * MB})
    text = render_report(run)
    rules = next(r for r in text.splitlines() if r.startswith("| Rules |")).split(" · ")
    assert {"max_growth 30MB (28.6MiB)", "max_peak 52428800B (50.0MiB)", "max_drift off"} <= {
        part.strip("| ") for part in rules
    }
    row = next(r for r in text.splitlines() if r.startswith("| validation epoch 0"))
    assert "| 30MB (28.6MiB) |" in row
    chart = section(text, "Memory Over the Run")
    assert 'y-axis "MiB"' in chart and "MiB per checkpoint" in chart
    for title in ("Configuration", "Memory Profile", "Memory Analysis"):
        assert not re.search(r"\d(MB|KB|GB)\b", section(text, title).replace("30MB", ""))


def test_growth_within_budget_passes_and_says_yes():
    samples = [s for s in incident() if s.label != "VALIDATION_BATCH"]
    samples[24:24] = [at(1611, "VALIDATION_BATCH", "validation", batch=b) for b in range(40)]
    text = render_report(run_of(samples))
    assert "**ALL CHECKS PASSING: YES**" in text and "Completion: 2/2 checks passing (100%)" in text
    assert "Root cause" not in text and "None: no rule was broken." in text


def test_a_loop_read_on_a_stride_shows_read_batches_only():
    """Batches between the probe's stride readings hold no reading: the profile's first, every
    Nth and last rows of a loop are the batches read at or before them, never ``n/a``."""
    samples = [s for s in incident() if s.label != "VALIDATION_BATCH"]
    loop = [at(1611 + b / 100, "VALIDATION_BATCH", "validation", batch=b) for b in range(203)]
    for b, sample in enumerate(loop):
        if b >= 32 and (b - 32) % 8:
            loop[b] = replace(sample, metrics={"allocated": None})
    samples[24:24] = loop
    profile = section(render_report(run_of(samples)), "Memory Profile").splitlines()
    rows = [line for line in profile if "VALIDATION_BATCH #" in line]
    assert rows and not any("n/a" in line for line in rows)
    assert rows[-1].startswith("Epoch 0 VALIDATION_BATCH #200:")  # the last read, not #202


def test_the_terminal_table_ends_a_loop_at_its_last_batch_read():
    """pytest's terminal table shows a loop's first batch and its last one read, never a batch
    between two stride readings as ``n/a``; a loop never read ends at its last batch."""
    from harness._report.terminal import checkpoint_table

    named = [at(1, "validation START", "validation"), at(9, "validation END", "validation")]
    read = [at(2 + b / 100, "VALIDATION_BATCH", "validation", batch=b) for b in range(50)]
    strided = [s if b < 32 or b % 8 == 0 else replace(s, metrics={}) for b, s in enumerate(read)]
    unread = [replace(s, metrics={}) for s in read]
    for loop, last in ((read, "#49"), (strided, "#48"), (unread, "#49")):
        rows = checkpoint_table([named[0], *loop, named[1]], "allocated")
        batches = [row for row in rows if "VALIDATION_BATCH" in row]
        assert [re.search(r"#\d+", row).group() for row in batches] == ["#0", last]
        assert ("n/a" in batches[-1]) == (loop is unread)


def test_an_oom_timeline_renders_oom_error_in_place_and_a_p0():
    run = run_of(incident(val_batches=30, oom=True))
    text = render_report(run)
    profile = section(text, "Memory Profile").splitlines()
    oom = [line for line in profile if line.startswith("[OOM ERROR]")]
    assert len(oom) == 1 and oom[0].startswith("[OOM ERROR] Epoch 0 validation batch 30:")
    assert "4000.0MiB / 4096.0MiB (97.7% utilization)" in oom[0] and "CUDA out of memory" in oom[0]
    assert profile.index(oom[0]) == len(profile) - 2  # the last row, before the closing fence
    assert "### Issue 1 (P0): Leak in validation epoch 0" in text  # the cause, before the symptom
    assert "(P0): Out of memory in validation epoch 0" in text
    assert "0 of 1 epochs completed" in text and "stopped at Epoch 0 validation batch 30" in text
    assert "out of memory at #55 (Epoch 0 validation batch 30)" in text
    assert "Judged on an incomplete timeline" in text


def test_one_oom_event_seen_twice_is_one_issue():
    samples = incident(val_batches=12, oom=True)
    over = at(4000, "VALIDATION_BATCH", "validation", batch=12, note="capacity 4GB exceeded")
    samples.insert(-1, replace(over, event="OOM"))  # as the recorder marks a capacity exceeded
    text = render_report(run_of(samples))
    (oom,) = judge(samples, RULES).of_kind("oom")
    assert [e.label for e in oom.evidence] == ["VALIDATION_BATCH"]  # the OOM reports it again
    assert text.count("Out of memory in validation epoch 0") == 1
    (row,) = [r for r in section(text, "Memory Profile").splitlines() if "[OOM ERROR]" in r]
    assert row.startswith("[OOM ERROR] Epoch 0 VALIDATION_BATCH #12:")
    assert "4000.0MiB / 4096.0MiB" in row
    assert row.endswith("(capacity 4GB exceeded; CUDA out of memory. Tried)")
    assert "out of memory at #37 (Epoch 0 VALIDATION_BATCH #12)." in text


def test_a_peak_in_another_metric_says_so_in_its_row():
    rss, peaks = 400 * MB, [0] * 30
    peaks[12] = 32 * MB  # one batch's high-water mark, of rss
    samples = [
        Sample(
            "VALIDATION_BATCH",
            "validation",
            0,
            b,
            1.0,
            {"allocated": 50 * MB, "rss": rss, "peak": rss + peaks[b]},
        )
        for b in range(30)
    ]
    run = run_of(samples, {"phase": "validation", "max_growth": "20MiB"})
    (stats,) = run.verdict.phases
    assert (stats.metric, stats.peak_metric) == ("allocated", "rss")
    analysis = section(render_report(run), "Memory Analysis")
    assert "| Phase | Metric | Batches | Start | End | Growth | Peak rise |" in analysis
    row = next(r for r in analysis.splitlines() if r.startswith("| validation epoch 0"))
    assert row.startswith("| validation epoch 0 | allocated | 25/30 | 50.0MiB | 50.0MiB |")
    assert "| +32.0MiB (rss) |" in row


def summary_cause(text):
    return next(line for line in text.splitlines() if line.startswith("- **Root cause:**"))


def test_the_root_cause_is_the_most_severe_finding_and_what_explains_an_oom():
    spike = at(1611 + 300, "TRAIN_BATCH", "training", batch=20)
    flat = [s for s in incident(val_batches=30, oom=True) if s.label != "VALIDATION_BATCH"]
    flat[24:24] = [at(1611, "VALIDATION_BATCH", "validation", batch=b) for b in range(30)]
    flat[-1] = replace(flat[-1], metrics={})  # the OOM event without a reading
    flat.insert(22, spike)
    rules = {"phase": ("training", "validation"), "max_growth": "1GB", "max_peak": "100MB"}
    run = run_of(flat, rules)
    assert {(f.kind, f.phase) for f in run.verdict.findings} == {
        ("peak", "training"),
        ("oom", "validation"),
    }
    cause = summary_cause(render_report(run))  # the P0 OOM, not the P1 peak of training
    assert cause.startswith("- **Root cause:** out of memory at OOM epoch 0 batch 30")

    leaky = run_of(incident(val_batches=30, oom=True))
    cause = summary_cause(render_report(leaky))
    assert cause.startswith("- **Root cause:** leak in validation epoch 0")
    assert "which ran the device out of memory in validation epoch 0" in cause


@pytest.mark.parametrize(
    "samples",
    [[], [at(100, "SESSION_START", "session", epoch=None)], [at(5, "X", None, None, batch=0)]],
    ids=["empty", "single", "lone-batch"],
)
def test_tiny_timelines_render(samples):
    text = render_report(Run("tiny", {}, samples, judge(samples, {}), torn=1))
    for heading in SECTIONS:
        assert heading in text or (heading == "## Memory Over the Run" and not samples)
    assert "device n/a" in text and "date n/a" in text
    assert "torn last line skipped" in text


def test_holders_go_to_findings_of_their_phase_only():
    samples = incident()
    samples.append(at(1700, "SESSION_END", "session", epoch=None, collected=True))
    rules = {**RULES, "teardown": "10MB"}
    store = {"path": "Trainer.store", "bytes": 10 * MB, "phase": "session"}
    text = render_report(run_of(samples, rules, holders=[HOLDER, store, "not a dict", {}]))
    leak = section(text, "Issues Found").split("### Issue 2")[0]
    teardown = section(text, "Issues Found").split("### Issue 2")[1]
    assert "`Trainer._attn_cache`" in leak and "`Trainer.store`" not in leak
    assert "held by `Trainer.store` (10.0MiB)" in teardown and "_attn_cache" not in teardown
    assert "held by an unnamed object" in leak  # the holder without a phase or a path


def test_a_peak_root_cause_names_the_holder_of_its_phase():
    samples = incident(val_batches=30, oom=True)
    rules = {**RULES, "max_growth": None, "max_peak": "100MB"}
    text = render_report(run_of(samples, rules, holders=[HOLDER]))
    cause = next(line for line in text.splitlines() if line.startswith("- **Root cause:**"))
    assert "peak in validation" in cause and "`Trainer._attn_cache`" in cause


def test_evidence_that_points_elsewhere_and_unknown_kinds_still_render():
    stray = Evidence(999, "GONE", "validation", 3, 7, "allocated", None)
    newer = Finding("peak", "training", 0, None, "a kind from a newer rules version")
    object.__setattr__(newer, "kind", "future-kind")
    findings = (Finding("oom", None, None, None, "out of memory: boom", evidence=(stray,)), newer)
    verdict = Verdict("ERROR", findings, error="RuntimeError: boom\nsecond line")
    text = render_report(Run("odd", HEADER, incident(), verdict))
    assert "The run raised `RuntimeError: boom second line`" in text
    assert "(P1): Future-kind in training epoch 0" in text
    assert "Epoch 3 GONE #7 = n/a" in text


def test_markdown_stays_well_formed_with_hostile_text():
    header = {**HEADER, "device": "a|b\n# not a heading", "meta": {"test": "t.py::x[```|]"}}
    samples = [at(1, "A ```` B", "p|q", batch=0, note="line\n## two")]
    text = render_report(Run("x", header, samples, judge(samples, {}), title="T\n# evil"))
    assert "\n# not a heading" not in text and "\n## two" not in text and "\n# evil" not in text
    block = section(text, "Memory Profile").split("\n\n", 1)[1]
    fence = block.split("text", 1)[0]
    assert len(fence) == 5 and block.rstrip().endswith(fence)
    assert "a\\|b" in section(text, "Configuration")


def retained(val_batches=40):
    """The incident's validation loop, its memory still held by a collected reading after it."""
    kept = at(1611 + val_batches, "AFTER_GC", "validation", collected=True)
    return [s if s.label != "AFTER_VALIDATION" else kept for s in incident(val_batches)]


def advice_lines(text):
    starts = ("- **Suspected root cause:**", "- **Recommended fix:**")
    return [line for line in text.splitlines() if line.startswith(starts)]


@pytest.mark.parametrize("holders", [[], [HOLDER]], ids=["no-holder", "holder"])
@pytest.mark.parametrize(
    ("samples", "outcome"),
    [(incident(), "released"), (retained(), "retained"), (incident(30, oom=True), "unchecked")],
    ids=["released", "retained", "oom"],
)
def test_advice_follows_the_findings_fields_never_their_message(samples, outcome, holders):
    rules = {**RULES, "max_peak": "30MB"}
    run = run_of(samples, rules, holders=holders)
    (leak,) = run.verdict.of_kind("leak")
    assert leak.outcome == outcome
    text = render_report(run)
    for message in ("", "released when the phase ended", "retained after collection", "x"):
        findings = tuple(replace(f, message=message) for f in run.verdict.findings)
        reworded = replace(run, verdict=replace(run.verdict, findings=findings))
        assert advice_lines(render_report(reworded)) == advice_lines(text)
    released = "released only when the phase ended"
    assert (released in "\n".join(advice_lines(text))) == (outcome == "released")


# -- hypothesis: arbitrary timelines never break the renderer ------------------------------------

LABELS = [
    "SESSION_START",
    "EPOCH_START",
    "TRAIN_BATCH",
    "VALIDATION_BATCH",
    "EPOCH_END",
    "OOM",
    "SESSION_END",
    "TEST_END",
    "x",
]
sizes = st.one_of(st.none(), st.integers(0, 2**40))
samples_strategy = st.lists(
    st.builds(
        Sample,
        label=st.sampled_from(LABELS),
        phase=st.sampled_from([None, "training", "validation", "session", "test"]),
        epoch=st.one_of(st.none(), st.integers(0, 3)),
        batch=st.one_of(st.none(), st.integers(0, 50)),
        time=st.floats(0, 2e9, allow_subnormal=False),
        metrics=st.dictionaries(st.sampled_from(["allocated", "rss", "reserved", "peak"]), sizes),
        collected=st.booleans(),
        note=st.one_of(st.none(), st.text(max_size=30), st.just("CUDA out of memory")),
    ),
    max_size=60,
)
json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_subnormal=False),
        st.text(max_size=10),
    ),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
headers = st.fixed_dictionaries(
    {},
    optional={
        "probe": json_values,
        "device": json_values,
        "capacity": st.one_of(sizes, json_values),
        "capacity_emulated": json_values,
        "started": st.one_of(st.floats(allow_subnormal=False), json_values),
        "config": st.one_of(
            json_values,
            st.dictionaries(
                st.sampled_from(["batch_size", "validation_batch_size", "epochs", "lr"]),
                json_values,
            ),
        ),
        "meta": st.one_of(
            json_values,
            st.dictionaries(
                st.sampled_from(["train_samples", "val_samples", "faults", "test"]), json_values
            ),
        ),
        "notes": json_values,
        "git_commit": json_values,
    },
)
holders_strategy = st.lists(
    st.one_of(
        json_values,
        st.fixed_dictionaries(
            {},
            optional={
                k: json_values for k in ("path", "container", "items", "bytes", "phase", "sites")
            },
        ),
    ),
    max_size=3,
)
rules_strategy = st.fixed_dictionaries(
    {},
    optional={
        "max_growth": st.integers(0, 2**30),
        "max_peak": st.integers(0, 2**30),
        "max_drift": st.integers(0, 2**30),
        "teardown": st.integers(0, 2**30),
        "warmup": st.integers(0, 10),
        "phase": st.sampled_from(["training", "validation"]),
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(samples_strategy, headers, holders_strategy, rules_strategy, st.integers(0, 1), st.text())
def test_the_renderer_never_raises(samples, header, holders, rules, torn, title):
    run = Run("h", header, samples, judge(samples, rules), title, holders, torn, "t.jsonl")
    text = render_report(run)
    assert all(s in text for s in SECTIONS if s != "## Memory Over the Run")
    json.dumps(run_document(run), default=str)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(samples_strategy, min_size=1, max_size=3), headers, rules_strategy)
def test_the_renderer_never_raises_on_ranks(parts, header, rules):
    """A merged run goes through the same sections, whatever each rank holds (none, one OOM,
    another's labels): a column per rank, none left out of a row it has."""
    ranks = tuple(
        RankRun(rank, {**header, "rank": rank}, samples, judge(samples, rules))
        for rank, samples in enumerate(parts)
    )
    merged = MergedRun("m", header, parts[0], ranks[0].verdict, ranks=ranks)
    text = render_report(merged)
    assert all(s in text for s in SECTIONS if s != "## Memory Over the Run")
    if any(parts):
        head = section(text, "Memory Profile").split("```text\n")[1].splitlines()[0]
        assert all(f"rank {rank}" in head for rank in range(len(parts)))


# -- chart ---------------------------------------------------------------------------------------


def test_a_long_run_is_drawn_in_spans_that_keep_a_one_batch_spike():
    readings = [100 * MB] * 5000
    readings[2345] = 900 * MB
    block = memory_chart({"allocated": readings})
    values = re.search(r"line \[([^\]]*)\]", "\n".join(block)).group(1).split(", ")
    assert len(values) == CHART_POINTS and "900.0" in values
    assert '    x-axis "checkpoint" 0 --> 4999' in block


def test_the_metric_that_fills_the_device_is_the_headers():
    """A header names its probe's capacity metric; for one written before it did, the samples
    tell (a caching allocator's ``reserved`` where they have it, else ``rss``), never the
    probe's name."""
    cuda = [
        Sample(
            "B", "validation", 0, i, 1.0, {"allocated": i * MB, "reserved": 2 * i * MB, "rss": MB}
        )
        for i in range(4)
    ]
    host = [
        Sample("B", "validation", 0, i, 1.0, {"allocated": i * MB, "rss": MB}) for i in range(4)
    ]
    old = {k: v for k, v in HEADER.items() if k != "capacity_metric"}
    assert run_of(cuda, header={**old, "probe": "cpu"}).capacity_metric == "reserved"
    assert run_of(host, header={**old, "probe": "cuda:0"}).capacity_metric == "rss"
    named = {**HEADER, "capacity_metric": "allocated"}
    assert run_of(cuda, header=named).capacity_metric == "allocated"


def test_the_capacity_line_appears_only_near_capacity():
    assert (
        sum(
            line.startswith("    line")
            for line in memory_chart({"a": [MB, 3 * MB]}, capacity=8 * MB)
        )
        == 2
    )
    assert (
        sum(
            line.startswith("    line")
            for line in memory_chart({"a": [MB, 3 * MB]}, capacity=80 * MB)
        )
        == 1
    )
    assert memory_chart({"a": [None, None]}) == [] and memory_chart({}) == []


# -- files: save_run, the index ------------------------------------------------------------------


KINDS = {"json": "json", "md": "md", "timeline": "jsonl"}


class FakeRecorder:
    def __init__(self, samples, header=HEADER):
        self.samples, self.header = samples, header


def test_save_run_writes_the_json_document_and_the_report(tmp_path):
    (tmp_path / "leaky.jsonl").write_text("{}\n")
    samples = incident()
    paths = save_run(
        tmp_path,
        "leaky",
        FakeRecorder(samples),
        judge(samples, RULES),
        title="TFT",
        holders=[HOLDER],
    )
    assert paths == {kind: tmp_path / f"leaky.{ext}" for kind, ext in KINDS.items()}
    doc = load_run_document(paths["json"])
    assert doc["schema_version"] == SCHEMA_VERSION and doc["status"] == "FAIL"
    assert doc["name"] == "leaky" and doc["title"] == "TFT" and doc["report"] == "leaky.md"
    assert doc["timeline"] == "leaky.jsonl" and doc["header"]["device"] == "Tesla T4"
    assert doc["attribution"] == [HOLDER] and doc["metric"] == "allocated"
    assert doc["run"] == {
        "epochs_completed": 1,
        "epochs_planned": 1,
        "samples": len(samples),
        "torn": 0,
        "ended": True,
        "duration_s": 0.0,
    }
    named = {c["name"]: c["metrics"]["allocated"] for c in doc["checkpoints"]}
    assert named["Epoch 0 AFTER_TRAINING"] == 1611 * MB and "Epoch 0 TRAIN_BATCH #0" not in named
    assert doc["worst_growth"] == pytest.approx(34 * MB)
    text = paths["md"].read_text()
    assert "[leaky.jsonl](leaky.jsonl)" in text and "[leaky.json](leaky.json)" in text


def test_a_bad_verdict_file_is_bad_input_naming_its_path_and_field(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"schema_version": 2, "status": "PASS", "phases": [{"epoch": 1.5}]}))
    with pytest.raises(BadInput) as bad:
        load_run_document(path)
    assert (bad.value.path, bad.value.field) == (str(path), "phases[0].epoch")
    assert str(bad.value) == f"{path}: phases[0].epoch: expected a whole number, got 1.5"


@pytest.mark.parametrize("name", ["", ".", "..", "a/b"])
def test_save_run_refuses_names_that_are_not_file_names(tmp_path, name):
    with pytest.raises(ValueError, match="plain file name"):
        save_run(tmp_path, name, FakeRecorder([]), judge([], {}))


def test_the_index_puts_totals_on_top_and_failures_first(tmp_path):
    flat = {"allocated": 1611 * MB}
    clean = [replace(s, metrics=flat) if s.label == "VALIDATION_BATCH" else s for s in incident()]
    header = {**HEADER, "meta": {"test": "t.py::test_clean"}}
    save_run(tmp_path, "a", FakeRecorder(clean, header), judge(clean, RULES))
    header = {**HEADER, "meta": {"test": "t.py::test_leaky"}, "started": 1_800_000_000.0}
    save_run(tmp_path, "b", FakeRecorder(incident(), header), judge(incident(), RULES))
    (tmp_path / "other.json").write_text('{"not": "a verdict"}')
    lines = write_index(tmp_path).read_text().splitlines()
    assert lines[0] == "# leakgate memory verdicts"
    assert lines[2].startswith("No baseline was compared: these are the runs' own verdicts")
    assert lines[4] == (
        "**2 traced runs: 1 PASS · 1 FAIL · 0 ERROR** · most severe: P0 leak in validation "
        "epoch 0: +34.0MiB (`t.py::test_leaky`)"
    )
    rows = [line for line in lines if line.startswith("| ")][1:]
    assert rows[0] == (
        "| **FAIL** | `t.py::test_leaky` | P0 leak in validation epoch 0: +34.0MiB "
        "| P0 leak (validation, +34.0MiB) | [b.md](b.md) |"
    )
    assert rows[1] == "| PASS | `t.py::test_clean` | none | none | [a.md](a.md) |"
    assert "1 JSON file here is not a leakgate verdict" in "\n".join(lines)
    recent = write_index(tmp_path, since=1_750_000_000.0).read_text()
    assert "**1 traced run: 0 PASS · 1 FAIL" in recent and "test_clean" not in recent


def test_the_index_shows_a_runs_most_severe_finding_in_its_own_unit(tmp_path):
    flat = [s for s in incident(val_batches=30, oom=True) if s.label != "VALIDATION_BATCH"]
    flat[24:24] = [at(1611, "VALIDATION_BATCH", "validation", batch=b) for b in range(30)]
    rules = {**RULES, "max_peak": "4GB"}
    save_run(tmp_path, "oom", FakeRecorder(flat), judge(flat, rules))
    doc = load_run_document(tmp_path / "oom.json")
    assert abs(doc["worst_growth"]) < MB  # the loop itself was flat
    text = write_index(tmp_path).read_text()
    row = next(line for line in text.splitlines() if line.startswith("| **FAIL**"))
    assert "| P0 oom in validation epoch 0: 3.9GiB in use |" in row
    assert "+0" not in row and "most severe: P0 oom in validation epoch 0: 3.9GiB in use" in text


def test_an_empty_directory_gets_an_index_that_says_so(tmp_path):
    assert "No traced run." in write_index(tmp_path / "new").read_text()


# -- compare -------------------------------------------------------------------------------------


def doc_with(scale=1.0, growth_scale=1.0):
    samples = incident()
    doc = run_document(run_of(samples))
    for point in doc["checkpoints"]:
        if point["label"] == "VALIDATION_END":
            point["metrics"] = {"allocated": round(point["metrics"]["allocated"] * scale)}
    for phase in doc["phases"]:
        phase["growth"] *= growth_scale
    return json.loads(json.dumps(doc))


def test_compare_has_a_noise_floor_for_small_numbers_and_gates_on_status():
    base = doc_with()
    tiny = doc_with(growth_scale=1.5)  # +17MB on a 34MB growth: beyond 10% and beyond 1MiB
    assert [c.item for c in compare_runs(base, tiny).regressions] == ["validation epoch 0 growth"]
    assert not compare_runs(base, tiny, min_bytes=64 * MB).regressed
    passed = {**base, "status": "PASS"}
    assert compare_runs(passed, base).regressed and compare_runs(passed, base).status_regressed
    assert not compare_runs(base, passed).regressed


# -- the plugin writes reports and an index --------------------------------------------------------

LEAKY = """
import pytest
import torch


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.memleak(phase="validation", max_growth="1MB")
def test_loop(memtrace, keep):
    kept = []
    with memtrace.phase("validation", epoch=0):
        for i in range(60):
            out = torch.ones(16384) * 2
            if keep:
                kept.append(out)
            memtrace.checkpoint("VALIDATION_BATCH", batch=i)
"""


@pytest.mark.parametrize("xdist", [False, True], ids=["serial", "xdist"])
def test_memreport_writes_a_report_per_test_and_one_index(pytester, xdist):
    pytester.makepyfile(test_mem=LEAKY)
    (pytester.path / "out").mkdir()
    (pytester.path / "out" / "stale.json").write_text(
        json.dumps({**doc_with(), "test": "old.py::gone"})
    )
    args = ["-p", "no:randomly", "--memreport=out"]
    run = pytester.runpytest_subprocess if xdist else pytester.runpytest
    result = run(*args, *(["-n", "2"] if xdist else []))
    result.assert_outcomes(passed=1, failed=1)
    out = pytester.path / "out"
    reports = sorted(p for p in out.glob("*.md") if p.name != "index.md")
    assert len(reports) == 2
    for report in reports:
        text = report.read_text()
        assert all(s in text for s in SECTIONS)
        assert f"[{report.stem}.jsonl]({report.stem}.jsonl)" in text
    index = (out / "index.md").read_text()
    assert "**2 traced runs: 1 PASS · 1 FAIL · 0 ERROR**" in index and "old.py::gone" not in index
    assert "test_mem.py::test_loop[True]" in index and "test_mem.py::test_loop[False]" in index
    assert index.index("[True]") < index.index("[False]")  # the failure first
    assert "index: out/index.md" in result.stdout.str()


def profile_cells(text):
    """The Memory Profile's rows, each split into its checkpoint and its cells."""
    block = section(text, "Memory Profile").split("```text\n")[1].split("```")[0]
    return [re.split(r":?\s{2,}", line.strip()) for line in block.splitlines()[1:]]


def test_a_merged_run_is_the_same_renderer_over_a_list_of_its_ranks():
    """A single run is a list of one: each rank of a merged run gets the rows, readings,
    utilization and figures its own report shows, in columns side by side."""
    flat = incident()
    leaking = [
        replace(s, metrics={"allocated": s.metrics["allocated"] + 2 * i * MB})
        for i, s in enumerate(flat)
    ]
    one = [run_of(samples, {**RULES, "max_growth": "60MiB"}) for samples in (flat, leaking)]
    ranks = tuple(RankRun(rank, HEADER, run.samples, run.verdict) for rank, run in enumerate(one))
    merged = MergedRun("both", HEADER, flat, one[1].verdict, ranks=ranks)
    text = render_report(merged)
    rows = profile_cells(text)
    own = [profile_cells(render_report(run)) for run in one]
    assert [row[0] for row in rows] == [row[0] for row in own[0]] == [row[0] for row in own[1]]
    for rank in (0, 1):  # its reading and the device's utilization, as its own report has them
        assert [row[1 + rank] for row in rows] == [row[1] for row in own[rank]]
    growth = [
        re.findall(r"^\| validation epoch 0 \|.*$", t, re.M)[0].split(" | ")
        for t in (text, *map(render_report, one))
    ]
    assert growth[0][3:5] == growth[1][5:7] and growth[0][6:8] == growth[2][5:7]
    assert "**FAIL** (rank 1)" in growth[0][-1] and "**FAIL**" not in growth[1][-1]

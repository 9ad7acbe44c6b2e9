"""The pytest plugin, through pytester: verdicts, failure messages, files, xdist, JUnit."""

import json
import xml.etree.ElementTree as ET

import pytest

from harness._frontends.plugin import safe_name
from harness._measure.sample import STRIDE

LOOP = """
import pytest
import torch

BATCHES = 176
HOLD = []


def loop(memtrace, *, keep=False, spike_at=None, fail_at=None):
    kept = []
    with memtrace.phase("validation", epoch=0):
        for i in range(BATCHES):
            size = 16384 * (32 if i == spike_at else 1)  # 64 KB of float32 per batch
            out = torch.ones(size) * 2
            if keep:
                kept.append(out)
            del out
            if i == fail_at:
                raise RuntimeError("boom in batch %d" % i)
            memtrace.checkpoint("VALIDATION_BATCH", batch=i)
    return len(kept)
"""


def run(pytester: pytest.Pytester, body: str, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_loop=LOOP + body)
    return pytester.runpytest("-p", "no:randomly", *args)


def test_a_64kb_per_batch_leak_fails_in_validation(pytester):
    result = run(
        pytester,
        """
@pytest.mark.memleak(phase="validation", max_growth="1MB")
def test_leaky(memtrace):
    loop(memtrace, keep=True)
""",
        "--memreport=out",
    )
    result.assert_outcomes(failed=1)
    last_read = max(i for i in range(176) if STRIDE.reads(i))  # on the probe's stride
    result.stdout.fnmatch_lines(
        [
            "*leakgate: memory verdict FAIL*",
            "*[[]P0 leak[]]*validation*",
            "*checkpoint*phase*allocated*delta*",
            "*VALIDATION_BATCH #0*",
            f"*VALIDATION_BATCH #{last_read}*",
            "*leakgate memory verdicts*",
            "FAIL*test_loop.py::test_leaky",
        ]
    )
    verdict = json.loads(next((pytester.path / "out").glob("*.json")).read_text())
    assert verdict["status"] == "FAIL" and verdict["schema_version"] >= 1
    leaks = [f for f in verdict["findings"] if f["kind"] == "leak"]
    assert [f["phase"] for f in leaks] == ["validation"]
    assert leaks[0]["slope"] == pytest.approx(65536, rel=0.15)
    assert verdict["test"] == "test_loop.py::test_leaky"


def test_the_same_loop_without_the_leak_passes_20_of_20(pytester):
    result = run(
        pytester,
        """
@pytest.mark.parametrize("attempt", range(20))
@pytest.mark.memleak(phase="validation", max_growth="1MB")
def test_clean(memtrace, attempt):
    loop(memtrace)
""",
    )
    result.assert_outcomes(passed=20)
    assert result.stdout.str().count("PASS ") == 20


def test_one_32x_batch_fails_only_the_peak_rule(pytester):
    result = run(
        pytester,
        """
@pytest.mark.memleak(phase="validation", max_growth="1MB", max_peak="1MB")
def test_spike(memtrace):
    loop(memtrace, spike_at=100)
""",
        "--memreport=out",
    )
    result.assert_outcomes(failed=1)
    verdict = json.loads(next((pytester.path / "out").glob("*.json")).read_text())
    assert {f["kind"] for f in verdict["findings"]} == {"peak"}
    assert verdict["findings"][0]["severity"] == "P1"


def test_a_raising_test_keeps_its_timeline_and_gets_error(pytester):
    result = run(
        pytester,
        """
@pytest.mark.memleak(phase="validation", max_growth="1MB")
def test_raises(memtrace):
    loop(memtrace, fail_at=50)
""",
        "--memreport=out",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*RuntimeError: boom in batch 50*", "ERROR*test_raises"])
    out = pytester.path / "out"
    verdict = json.loads(next(out.glob("*.json")).read_text())
    assert verdict["status"] == "ERROR" and "boom in batch 50" in verdict["error"]
    lines = next(out.glob("*.jsonl")).read_text().splitlines()
    *samples, end = [json.loads(line) for line in lines[1:]]
    assert [s["batch"] for s in samples if s["label"] == "VALIDATION_BATCH"] == list(range(50))
    assert samples[-1]["label"] == "TEST_END" and "RuntimeError" in samples[-1]["note"]
    error = end["leakgate_end"]["error"]
    assert error["type"] == "RuntimeError" and error["message"].startswith("boom in batch 50")


def test_marker_alone_traces_the_whole_test_for_teardown(pytester):
    result = run(
        pytester,
        """
@pytest.mark.memleak(teardown="4MB")
def test_keeps_16mb():
    HOLD.append(torch.ones(4 * 2**20))


@pytest.mark.memleak(teardown="4MB")
def test_frees_what_it_used():
    data = torch.ones(4 * 2**20)
    assert data.sum() > 0
""",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*[[]P0 teardown[]]*", "FAIL*test_keeps_16mb*"])


def test_memreport_defaults_to_reports_and_writes_timeline_and_verdict(pytester):
    result = run(
        pytester,
        """
@pytest.mark.parametrize("name", ["../../escape", "a/b"])
def test_named(memtrace, name):
    loop(memtrace)
""",
        "--memreport",
    )
    result.assert_outcomes(passed=2)
    files = sorted(p.name for p in (pytester.path / "reports").iterdir())
    assert len(files) == 7 and all("/" not in f and not f.startswith(".") for f in files)
    assert sorted(f.rsplit(".", 1)[1] for f in files) == ["json"] * 2 + ["jsonl"] * 2 + ["md"] * 3
    timeline = next((pytester.path / "reports").glob("*.jsonl")).read_text().splitlines()
    header = json.loads(timeline[0])
    assert header["meta"]["test"].startswith("test_loop.py::test_named[")
    labels = [json.loads(line)["label"] for line in timeline[1:-1]]
    end = json.loads(timeline[-1])["leakgate_end"]
    assert end["error"] is None and end["holders"] == end["shares"] == []
    assert end["rules"] == json.loads(timeline[0])["rules"]
    assert labels[0] == "TEST_START" and labels[-1] == "TEST_END"
    assert labels.count("VALIDATION_BATCH") == 176


def test_without_memreport_no_file_is_written_but_rules_still_apply(pytester):
    result = run(
        pytester,
        """
@pytest.mark.memleak(phase="validation", max_growth="1MB")
def test_leaky(memtrace):
    loop(memtrace, keep=True)
""",
    )
    result.assert_outcomes(failed=1)
    assert not (pytester.path / "reports").exists()


def test_ini_defaults_apply_and_the_marker_overrides_them(pytester):
    pytester.makeini("[pytest]\nmemleak_max_growth = 1MB\nmemleak_phase = validation\n")
    result = run(
        pytester,
        """
def test_from_ini(memtrace):
    loop(memtrace, keep=True)


@pytest.mark.memleak(max_growth="64MB")
def test_overridden(memtrace):
    loop(memtrace, keep=True)
""",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["FAIL*test_from_ini", "PASS*test_overridden"])
    result.stdout.fnmatch_lines(["*> max_growth 1MB*"])  # the ini's size as it was written


def test_attribute_and_explain_are_rule_options_from_ini_or_marker_and_are_saved(pytester):
    pytester.makeini("[pytest]\nmemleak_attribute = true\n")
    result = run(
        pytester,
        """
@pytest.mark.memleak(max_growth="64MB")
def test_from_ini(memtrace):
    loop(memtrace)


@pytest.mark.memleak(max_growth="64MB", attribute=False, explain=True)
def test_overridden(memtrace):
    loop(memtrace)
""",
        "--memreport=out",
    )
    result.assert_outcomes(passed=2)
    docs = {
        d["test"].rsplit("::", 1)[1]: d["rules"]
        for d in map(json.loads, (p.read_text() for p in (pytester.path / "out").glob("*.json")))
    }
    assert (docs["test_from_ini"]["attribute"], docs["test_from_ini"]["explain"]) == (True, False)
    assert (docs["test_overridden"]["attribute"], docs["test_overridden"]["explain"]) == (
        False,
        True,
    )
    pytester.makeini("[pytest]\nmemleak_explain = maybe\n")
    result = run(pytester, "\ndef test_x(memtrace):\n    pass\n")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*memleak: explain: expected true or false, got 'maybe'*"])


def test_bad_marker_arguments_are_a_usage_error(pytester):
    result = run(
        pytester,
        """
@pytest.mark.memleak(max_growth="abc")
def test_bad():
    pass
""",
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*memleak: Rules.max_growth*cannot read 'abc'*"])


def test_verdicts_reach_junit_xml(pytester):
    run(
        pytester,
        """
@pytest.mark.memleak(phase="validation", max_growth="1MB")
def test_leaky(memtrace):
    loop(memtrace, keep=True)
""",
        "--junitxml=junit.xml",
    )
    props = ET.parse(pytester.path / "junit.xml").findall(".//property[@name='leakgate']")
    assert len(props) == 1 and json.loads(props[0].get("value"))["status"] == "FAIL"


def test_xdist_workers_write_their_files_and_the_summary_covers_all(pytester):
    pytester.makepyfile(
        test_loop=LOOP
        + """
@pytest.mark.parametrize("keep", [False, True, False, True])
@pytest.mark.memleak(phase="validation", max_growth="1MB")
def test_split(memtrace, keep):
    loop(memtrace, keep=keep)
"""
    )
    result = pytester.runpytest_subprocess("-n", "2", "--memreport=out")
    result.assert_outcomes(passed=2, failed=2)
    assert result.stdout.str().count("test_loop.py::test_split[") >= 4
    assert len(list((pytester.path / "out").glob("*.json"))) == 4


@pytest.mark.parametrize(
    "nodeid", ["t.py::test[../../etc/passwd]", "t.py::test[a/b]", "t.py::test[" + "x" * 300 + "]"]
)
def test_safe_name_cannot_escape_and_stays_unique(nodeid):
    name = safe_name(nodeid)
    assert "/" not in name and ".." not in name and len(name) <= 89
    assert safe_name(nodeid) == name != safe_name(nodeid + "x")


def test_attribute_names_the_holder_of_an_in_phase_leak(pytester):
    result = run(
        pytester,
        """
class Cache:
    def __init__(self):
        self.items = []


@pytest.mark.memleak(phase="validation", max_growth="1MB", attribute=True)
def test_cached(memtrace):
    cache = Cache()
    with memtrace.phase("validation", epoch=0):
        for i in range(BATCHES):
            cache.items.append(torch.ones(16384))
            memtrace.checkpoint("VALIDATION_BATCH", batch=i)
""",
        "--memreport=out",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*held by Cache.items (list, 176 items, *MiB)*"])
    verdict = json.loads(next((pytester.path / "out").glob("*.json")).read_text())
    assert verdict["attribution"][0]["path"] == "Cache.items"


def test_a_teardown_leak_is_attributed_after_the_failure_without_asking(pytester):
    result = run(
        pytester,
        """
@pytest.mark.memleak(teardown="4MB")
def test_keeps_16mb():
    HOLD.append(torch.ones(4 * 2**20))
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*held by test_loop.HOLD (list, 1 item, 16.0MiB)*"])


BROKEN_RULES = """
import sys

from harness import Finding, register_rule


def recurse(ctx, option):
    return recurse(ctx, option)


def bad_check(ctx, option):
    ctx.check("bad_check", "run", "MAYBE", "not a status")
    return []


register_rule("raises", lambda ctx, option: 1 / 0)
register_rule("gives_none", lambda ctx, option: None)
register_rule("gives_text", lambda ctx, option: "leak")
register_rule("gives_numbers", lambda ctx, option: [1, 2])
register_rule("no_option", lambda ctx: [])
register_rule("recurses", recurse)
register_rule("exits", lambda ctx, option: sys.exit(3))
register_rule("bad_check", bad_check)
register_rule("bad_kind", lambda ctx, option: [Finding("bogus", None, None, 1, "x")])
"""
BROKEN_NAMES = [
    "raises",
    "gives_none",
    "gives_text",
    "gives_numbers",
    "no_option",
    "recurses",
    "exits",
    "bad_check",
    "bad_kind",
]


@pytest.fixture
def registered_by_conftest():
    """The names a pytester conftest registers in this process, unregistered afterwards."""
    from harness._rules.registry import unregister_rule

    names: list[str] = []
    yield names
    for name in names:
        unregister_rule(name)


def test_a_rule_that_cannot_judge_errors_its_test_and_the_session_goes_on(
    pytester, registered_by_conftest, capsys
):
    from harness._frontends.cli import main as leakgate

    registered_by_conftest += BROKEN_NAMES
    pytester.makeconftest(BROKEN_RULES)
    body = "".join(
        f"""

@pytest.mark.memleak({name}="1MB")
def test_{name}(memtrace):
    loop(memtrace)
"""
        for name in BROKEN_NAMES
    )
    result = run(pytester, body + "\n\ndef test_after():\n    pass\n", "--memreport=out")
    assert result.ret == 1 and "INTERNALERROR" not in result.stdout.str()
    result.assert_outcomes(passed=1, failed=len(BROKEN_NAMES))
    result.stdout.fnmatch_lines(
        [f"*error: rule '{name}' could not judge: *" for name in BROKEN_NAMES],
        consecutive=False,
    )
    for name in BROKEN_NAMES:
        saved = pytester.path / "out" / f"{safe_name(f'test_loop.py::test_{name}')}.json"
        doc = json.loads(saved.read_text())
        assert doc["status"] == "ERROR"
        assert any(c["rule"] == name and c["status"] == "ERROR" for c in doc["checks"])
    assert leakgate(["gate", str(pytester.path / "out")]) == 1
    assert (
        f"0 PASS · 0 REGRESSION · 0 FAIL · {len(BROKEN_NAMES)} ERROR"
        in (pytester.path / "out" / "index.md").read_text()
    )


def test_a_rule_option_beyond_float_range_errors_its_test_at_the_marker(
    pytester, registered_by_conftest
):
    registered_by_conftest.append("budget")
    pytester.makeconftest(
        "from harness import register_rule\nregister_rule('budget', lambda ctx, option: [])\n"
    )
    body = """

@pytest.mark.memleak(budget=10**400)
def test_huge(memtrace):
    loop(memtrace)


def test_after():
    pass
"""
    result = run(pytester, body, "--memreport=out")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        ["*test_huge*memleak: Rules.custom.budget: an integer beyond a float's range*"]
    )
    assert not list((pytester.path / "out").glob("*huge*"))


def test_a_run_failed_by_a_registered_rule_is_not_a_pass_once_rebuilt_without_it(
    pytester, registered_by_conftest, capsys
):
    from harness._frontends.cli import main as leakgate
    from harness._rules.registry import unregister_rule

    registered_by_conftest.append("always_fails")
    pytester.makeconftest(
        """
from harness import Finding, register_rule


@register_rule("always_fails")
def always_fails(ctx, option):
    ctx.check("always_fails", "run", "FAIL", "failed on purpose")
    return [Finding("leak", None, None, 1, "failed on purpose")]
"""
    )
    body = """

@pytest.mark.memleak(always_fails="1MB")
def test_failed(memtrace):
    loop(memtrace)
"""
    run(pytester, body, "--memreport=out").assert_outcomes(failed=1)
    unregister_rule("always_fails")  # rebuilt where the conftest is not loaded
    out = pytester.path / "out"
    timeline = out / f"{safe_name('test_loop.py::test_failed')}.jsonl"
    assert leakgate(["report", str(timeline)]) == 1
    rebuilt = json.loads(timeline.with_suffix(".rebuilt.json").read_text())
    assert rebuilt["status"] == "ERROR"
    assert "'always_fails' is read by no registered rule" in rebuilt["error"]
    assert leakgate(["gate", str(out)]) == 1
    capsys.readouterr()

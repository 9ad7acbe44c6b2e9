"""Baselines from pytest: ``--memreport-save``, ``--memreport-compare``, ``--memreport-json``,
in a fresh project through pytester, and the gate's rule shared with ``leakgate gate``."""

import json

import pytest
from test_plugin import LOOP

from harness._frontends.cli import main
from harness._frontends.plugin import safe_name
from harness._results.baseline import SUMMARY_SCHEMA, judge_verdict

BODY = """
@pytest.mark.memleak(phase="validation", max_growth="100MB")
def test_loop_keeps(memtrace):
    loop(memtrace, keep={keep})


@pytest.mark.memleak(phase="validation", max_growth="100MB")
def test_loop_clean(memtrace):
    loop(memtrace)
"""

NUMBER = {"type": ["number", "null"]}
PHASE = {
    "type": "object",
    "required": ["phase", "epoch", "metric", "status", "growth", "slope", "peak_rise", "budget"],
    "properties": {
        "phase": {"type": ["string", "null"]},
        "epoch": {"type": ["integer", "null"]},
        "metric": {"type": ["string", "null"]},
        "status": {"type": "string"},
        "growth": NUMBER,
        "slope": NUMBER,
        "peak_rise": NUMBER,
        "budget": NUMBER,
    },
}
CHANGE = {
    "type": "object",
    "required": ["item", "metric", "base", "new", "per_batch", "regression"],
    "properties": {
        "item": {"type": "string"},
        "metric": {"type": "string"},
        "base": NUMBER,
        "new": NUMBER,
        "per_batch": {"type": "boolean"},
        "regression": {"type": "boolean"},
    },
}
COMPARISON = {
    "type": ["object", "null"],
    "required": ["regressed", "base_status", "new_status", "tolerance", "min_bytes", "changes"],
    "properties": {
        "regressed": {"type": "boolean"},
        "base_status": {"type": "string"},
        "new_status": {"type": "string"},
        "tolerance": {"type": "number"},
        "min_bytes": {"type": "integer"},
        "changes": {"type": "array", "items": CHANGE},
    },
}
SCHEMA = {
    "type": "object",
    "required": [
        "schema",
        "created",
        "tests",
        "baseline",
        "saved",
        "regressions",
        "missing",
        "failed",
    ],
    "properties": {
        "schema": {"enum": [SUMMARY_SCHEMA]},
        "created": {"type": "string"},
        "baseline": {"type": ["string", "null"]},
        "saved": {"type": ["string", "null"]},
        "regressions": {"type": "array", "items": {"type": "string"}},
        "missing": {"type": "array", "items": {"type": "string"}},
        "failed": {"type": "boolean"},
        "tests": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["test", "verdict", "worst_growth", "phases", "comparison"],
                "properties": {
                    "test": {"type": "string"},
                    "verdict": {"enum": ["PASS", "FAIL", "ERROR"]},
                    "worst_growth": NUMBER,
                    "phases": {"type": "array", "items": PHASE},
                    "comparison": COMPARISON,
                },
            },
        },
    },
}
TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "null": type(None),
    "integer": int,
    "number": (int, float),
}


def violations(value, schema, where="$"):
    """Where ``value`` breaks ``schema`` (the subset of JSON Schema used above)."""
    found = []
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        bool_ok = "boolean" in kinds
        if not any(isinstance(value, TYPES[k]) for k in kinds) or (
            isinstance(value, bool) and not bool_ok
        ):
            return [f"{where}: {value!r} is not {kinds}"]
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{where}: {value!r} not in {schema['enum']}")
    if isinstance(value, dict):
        found += [f"{where}: no {key}" for key in schema.get("required", ()) if key not in value]
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                found += violations(value[key], sub, f"{where}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            found += violations(item, schema["items"], f"{where}[{i}]")
    return found


def project(pytester, *, keep):
    pytester.makepyfile(test_loop=LOOP + BODY.format(keep=keep))


def test_a_saved_baseline_then_a_leaking_change_fails_the_session_naming_it(pytester):
    project(pytester, keep=False)
    saved = pytester.runpytest("-p", "no:randomly", "--memreport=out", "--memreport-save")
    saved.assert_outcomes(passed=2)
    assert saved.ret == 0
    kept = pytester.path / ".leakgate" / "baseline"
    names = sorted(p.name for p in kept.glob("*.json"))
    assert names == sorted(
        f"{safe_name(f'test_loop.py::test_loop_{t}')}.json" for t in ("keeps", "clean")
    )

    project(pytester, keep=True)  # 64 KB per batch kept: within the test's budget, not the base's
    result = pytester.runpytest(
        "-p", "no:randomly", "--memreport=out", "--memreport-compare", "--memreport-json=s.json"
    )
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "leakgate REGRESSION test_loop.py::test_loop_keeps against the baseline *baseline",
            "*validation epoch 0 growth (allocated):*->*",
            "leakgate baseline *: FAIL: 1 of 2 verdicts regressed, 0 missing, 0 without a base",
        ]
    )
    assert "REGRESSION test_loop.py::test_loop_clean" not in result.stdout.str()
    index = (pytester.path / "out" / "index.md").read_text()
    assert "**Gate: FAIL**: 1 of 2 verdicts regressed, 0 missing, 0 without a base" in index
    rows = [line for line in index.splitlines() if line.startswith("| ")]
    assert next(r for r in rows if "test_loop_keeps" in r).startswith("| **REGRESSION** |")
    summary = json.loads((pytester.path / "s.json").read_text())
    assert violations(summary, SCHEMA) == []
    assert summary["regressions"] == ["test_loop.py::test_loop_keeps"] and summary["failed"]
    tests = {t["test"]: t for t in summary["tests"]}
    keeps = tests["test_loop.py::test_loop_keeps"]
    assert keeps["verdict"] == "PASS" and keeps["comparison"]["regressed"]
    assert keeps["phases"][0]["phase"] == "validation" and keeps["phases"][0]["growth"] > 5e6

    # the same verdicts, gated by the command line against the same baseline: the same outcome
    assert main(["gate", str(pytester.path / "out"), "--baseline", str(kept)]) == 1


def test_the_unchanged_project_passes_the_comparison_and_a_named_baseline_is_kept(pytester):
    project(pytester, keep=False)
    storage = pytester.path / "store"
    args = ["-p", "no:randomly", "--memreport=out", f"--memreport-storage={storage}"]
    assert pytester.runpytest(*args, "--memreport-save=nightly").ret == 0
    assert len(list((storage / "nightly").glob("*.json"))) == 2
    result = pytester.runpytest(*args, "--memreport-compare=nightly")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["leakgate baseline *nightly: PASS: 0 of 2 verdicts regressed*"])
    by_path = pytester.runpytest(
        "-p", "no:randomly", "--memreport=o2", f"--memreport-compare={storage / 'nightly'}"
    )
    assert by_path.ret == 0


def test_a_baseline_test_that_this_session_did_not_run_fails_it(pytester):
    project(pytester, keep=False)
    assert pytester.runpytest("-p", "no:randomly", "--memreport=out", "--memreport-save").ret == 0
    result = pytester.runpytest(
        "-p", "no:randomly", "--memreport=out", "--memreport-compare", "-k", "clean"
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["leakgate REGRESSION missing from the run: *test_loop_keeps*"])


def test_the_json_summary_needs_no_memreport_and_parses(pytester):
    project(pytester, keep=False)
    result = pytester.runpytest("-p", "no:randomly", "--memreport-json=sub/summary.json")
    assert result.ret == 0
    summary = json.loads((pytester.path / "sub" / "summary.json").read_text())
    assert violations(summary, SCHEMA) == []
    assert summary["baseline"] is None and not summary["failed"] and len(summary["tests"]) == 2


def test_the_summary_is_the_judged_outcome_not_the_property_text(pytester):
    """In one process the plugin keeps each test's outcome as it judged it: the ``leakgate``
    property is written for JUnit XML and xdist, never read back here, so a hook that
    rewrites it changes nothing the summary says."""
    project(pytester, keep=True)
    pytester.makeconftest(
        """
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    report.user_properties = [(k, "{}") for k, _ in report.user_properties]
"""
    )
    result = pytester.runpytest("-p", "no:randomly", "--memreport-json=s.json")
    assert result.ret == 0 and "INTERNALERROR" not in result.stdout.str()
    summary = json.loads((pytester.path / "s.json").read_text())
    assert violations(summary, SCHEMA) == []
    judged = {t["test"]: (t["verdict"], t["phases"][0]["phase"]) for t in summary["tests"]}
    assert judged == {
        "test_loop.py::test_loop_clean": ("PASS", "validation"),
        "test_loop.py::test_loop_keeps": ("PASS", "validation"),
    }


def test_xdist_the_controller_compares_and_writes_once(pytester):
    project(pytester, keep=False)
    args = ["-p", "no:randomly", "-n", "2", "--memreport=out"]
    assert pytester.runpytest_subprocess(*args, "--memreport-save").ret == 0
    project(pytester, keep=True)
    result = pytester.runpytest_subprocess(*args, "--memreport-compare", "--memreport-json=s.json")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert result.stdout.str().count("leakgate REGRESSION test_loop.py::test_loop_keeps") == 1
    assert len(json.loads((pytester.path / "s.json").read_text())["tests"]) == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--memreport=out", "--memreport-compare=nope"], "*leakgate: *nope: no such baseline*"),
        (
            ["--memreport=out", "--memreport-compare=./a_file"],
            "*a_file: a baseline must be a folder*",
        ),
        (["--memreport=out", "--memreport-save=a/b/../"], "*not a plain file name*"),
        (["--memreport-save"], "*--memreport-save: needs --memreport*"),
        (["--memreport=out", "--memreport-save", "--memreport-storage=a_file"], "*not a folder*"),
        (["--memreport-json=."], "*--memreport-json: expected a file path*"),
    ],
)
def test_bad_values_are_one_usage_error(pytester, args, message):
    project(pytester, keep=False)
    (pytester.path / "a_file").write_text("x")
    result = pytester.runpytest("-p", "no:randomly", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_the_gate_rule_is_status_then_regression():
    document = {"status": "PASS", "phases": [], "checks": []}
    assert not judge_verdict(document).failed
    assert judge_verdict({**document, "status": "FAIL"}).failed
    # nothing in common with the base: the comparison proves nothing, so it regresses
    assert judge_verdict(document, document).regressed

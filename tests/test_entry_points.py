"""Entry points outside the plugin's own files: ``run_ranks`` inside a pytest test writes into
``--memreport`` (so ``leakgate gate`` sees the run), and the Lightning callback prints the
verdict line and the report's path when a fit ends, passing or failing."""

import json

import pytest
from test_lightning import Forecaster, LeakyValidation, fit

from harness import Rules
from harness._frontends.cli import main
from harness.integrations.lightning import LeakGateCallback

RANKS = """
from harness._frontends.distributed import run_ranks


def body(recorder):
    with recorder.phase("validation", epoch=0):
        for b in range(12):
            recorder.checkpoint("BATCH", batch=b)


def test_ranks():
    rules = {"phase": "validation", "max_growth": "40KiB", "warmup": 5}
    assert run_ranks(body, 2, rules=rules).verdict.passed
"""
LOOPS = Rules(phase=("training", "validation"), max_growth="1MB")
"""No teardown rule: the first fit in a process keeps Lightning's one-time allocations."""


def test_run_ranks_in_a_test_writes_into_memreport_and_the_gate_sees_it(pytester):
    pytester.makepyfile(test_ranks=RANKS)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "--memreport=out")
    result.assert_outcomes(passed=1)
    out = pytester.path / "out"
    [verdict] = out.glob("test_ranks*.json")
    assert json.loads(verdict.read_text())["status"] == "PASS"
    assert len(list(out.glob("test_ranks*.rank*.jsonl"))) == 2
    assert main(["gate", str(out)]) == 0


@pytest.mark.parametrize(("module", "status"), [(Forecaster, "PASS"), (LeakyValidation, "FAIL")])
def test_the_callback_prints_its_verdict_and_report_when_a_fit_ends(
    tmp_path, capsys, module, status
):
    fit(module(), LeakGateCallback(rules=LOOPS, directory=tmp_path))
    lines = capsys.readouterr().out.splitlines()
    assert f"memory verdict: {status}" in lines
    assert f"  report: {tmp_path / 'lightning.md'}" in lines

"""The session's ``--memreport*`` options on odd ground, through pytest with the plugin: a
baseline compared and saved in one session, folders and summaries that cannot be written,
paths a thousand levels deep, the process's own streams as the summary."""

import json

import pytest
from test_baseline import project

from harness.plugin import safe_name

ARGS = ("-p", "no:randomly", "--memreport=out")
KEEPS = f"{safe_name('test_loop.py::test_loop_keeps')}.json"


@pytest.mark.parametrize("compared", ["base", "./.leakgate/base"], ids=["by-name", "by-path"])
def test_a_session_that_regressed_is_not_saved_over_the_baseline_it_compared_with(
    pytester, compared
):
    project(pytester, keep=False)
    assert pytester.runpytest(*ARGS, "--memreport-save=base").ret == 0
    kept = pytester.path / ".leakgate" / "base" / KEEPS
    before = kept.read_text()
    project(pytester, keep=True)
    both = (f"--memreport-compare={compared}", "--memreport-save=base", "--memreport-json=s.json")
    for _ in range(2):  # the retry fails as the first run did
        result = pytester.runpytest(*ARGS, *both)
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        assert kept.read_text() == before
        assert json.loads((pytester.path / "s.json").read_text())["saved"] is None
        result.stdout.fnmatch_lines(["leakgate REGRESSION test_loop.py::test_loop_keeps*"])
        result.stdout.fnmatch_lines(["leakgate: the baseline *base was kept as it was: *"])
    project(pytester, keep=False)  # a session that passes moves the baseline on
    result = pytester.runpytest(*ARGS, *both)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["leakgate: saved 2 verdicts as the baseline *base"])

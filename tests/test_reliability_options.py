"""The session's ``--memreport*`` options on odd ground, through pytest with the plugin: a
baseline compared and saved in one session, folders and summaries that cannot be written,
paths a thousand levels deep, the process's own streams as the summary."""

import json
import os

import pytest
from test_baseline import project
from test_session_paths import RAN, refused

from harness._frontends.plugin import safe_name

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


on_linux = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")


@on_linux
@pytest.mark.parametrize(
    "args",
    [
        ["--memreport=/proc/x"],
        ["--memreport=a_file/sub"],
        ["--memreport=out", "--memreport-save", "--memreport-storage=/proc/x"],
        ["--memreport=out", "--memreport-save", "--memreport-storage=a_file/sub"],
        ["--memreport-json=/proc/version"],
        ["--memreport-json=/proc/x"],
    ],
    ids=[
        "report-proc",
        "report-under-a-file",
        "storage-proc",
        "storage-under-a-file",
        "json-proc-version",
        "json-proc",
    ],
)
def test_a_folder_or_summary_that_cannot_be_written_is_refused_before_any_test_runs(pytester, args):
    pytester.makepyfile(test_ran=RAN)
    (pytester.path / "a_file").write_text("x")
    refused(pytester.runpytest("-p", "no:randomly", *args), pytester, "cannot be written")
    assert (pytester.path / "a_file").read_text() == "x"
    assert sorted(p.name for p in pytester.path.iterdir()) == ["a_file", "test_ran.py"]


@pytest.mark.parametrize(
    "save", [[], ["--memreport=out", "--memreport-save"]], ids=["alone", "saving"]
)
def test_a_summary_named_as_the_storage_folder_is_refused_before_any_test_runs(pytester, save):
    pytester.makepyfile(test_ran=RAN)
    args = ["-p", "no:randomly", *save, "--memreport-json=S", "--memreport-storage=S"]
    refused(pytester.runpytest(*args), pytester, "--memreport-storage")
    assert not (pytester.path / "S").exists()


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_baseline_verdict_that_is_not_a_file_is_refused_before_any_test_runs(pytester, kind):
    project(pytester, keep=False)
    assert pytester.runpytest(*ARGS, "--memreport-save").ret == 0
    verdict = pytester.path / ".leakgate" / "baseline" / KEEPS
    verdict.unlink()
    if kind == "fifo":
        os.mkfifo(verdict)
    else:
        verdict.mkdir()
    pytester.makepyfile(test_ran=RAN)
    refused(pytester.runpytest(*ARGS, "--memreport-compare"), pytester, "untrustworthy baseline")


DEEP = "d/" * 1000  # 1,000 levels, 2,000 bytes: within PATH_MAX from pytester's folder


def remove_tree(top):
    """Remove ``top`` a level at a time (``shutil.rmtree``, and pytest's clean-up of its
    folders, recurse once per level)."""
    stack = [top] if os.path.isdir(top) else []
    while stack:
        folders = [e.path for e in os.scandir(stack[-1]) if e.is_dir(follow_symlinks=False)]
        if folders:
            stack.extend(folders)
            continue
        folder = stack.pop()
        for entry in os.scandir(folder):
            os.unlink(entry.path)
        os.rmdir(folder)


@pytest.fixture
def deep(pytester):
    """``DEEP``, relative to pytester's folder, removed when the test ends."""
    yield DEEP
    remove_tree(pytester.path / "d")


@pytest.mark.parametrize(
    ("args", "written"),
    [
        (["--memreport={}r"], "r/index.md"),
        (["--memreport=out", "--memreport-json={}s.json"], "s.json"),
        (["--memreport=out", "--memreport-save", "--memreport-storage={}st"], "st/baseline"),
    ],
    ids=["report", "json", "storage"],
)
def test_a_path_a_thousand_levels_deep_is_written_and_every_verdict_shown(
    pytester, deep, args, written
):
    project(pytester, keep=False)
    # the test file is named: collecting the rootdir would walk the deep folders (pytest's own)
    result = pytester.runpytest(
        "-p", "no:randomly", *(a.format(deep) for a in args), "test_loop.py"
    )
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*leakgate memory verdicts*", "PASS*test_loop_clean"])
    assert os.path.exists(deep + written)
    assert "RecursionError" not in result.stdout.str() + result.stderr.str()


def test_leakgate_report_writes_a_report_a_thousand_levels_deep(tmp_path, monkeypatch):
    from test_cli import clean, write_timeline

    from harness._frontends.cli import main

    monkeypatch.chdir(tmp_path)
    write_timeline(tmp_path / "run.jsonl", clean())
    try:
        assert main(["report", "run.jsonl", "-o", f"{DEEP}run.md"]) == 0
        assert os.path.exists(f"{DEEP}run.md") and os.path.exists(f"{DEEP}run.json")
    finally:
        remove_tree(tmp_path / "d")


@pytest.mark.parametrize("stream", ["/dev/stdout", "/dev/fd/1", "/dev/stderr"])
def test_a_summary_to_the_processs_own_stream_redirected_to_a_file_is_written_there(
    pytester, stream
):
    project(pytester, keep=False)
    # pytester's subprocess writes its stdout and stderr to files, as `pytest ... > log` does
    result = pytester.runpytest_subprocess("-p", "no:randomly", f"--memreport-json={stream}")
    assert result.ret == 0
    log = (result.stderr if stream == "/dev/stderr" else result.stdout).str()
    start = log.index('{\n  "schema": "leakgate-session/1"')
    summary, _ = json.JSONDecoder().raw_decode(log, start)
    assert [t["verdict"] for t in summary["tests"]] == ["PASS", "PASS"]
    # written at the descriptor's offset: what pytest wrote before the summary is still there
    result.stdout.fnmatch_lines(["*test session starts*", f"leakgate: session summary in {stream}"])

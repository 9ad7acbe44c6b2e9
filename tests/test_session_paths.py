"""The session's paths and names, checked where they enter: every ``--memreport*`` option is
refused before any test runs when it cannot work (pytest's usage error, one line), and what the
session writes at its end (the summary, the saved baseline) respects what is there."""

import json
import os

import pytest
from test_baseline import project

import harness._results.baseline as baseline
from harness._frontends.plugin import safe_name

RAN = """
def test_ran():
    open("ran", "w").close()
"""

LONG = "x" * 5000
DEEP = ("d" * 100 + "/") * 50  # short components, 5,050 bytes in all


def refused(result, pytester, text):
    """The session was a usage error: one line naming the problem, nothing run."""
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.strip()]
    assert len(errors) == 1 and text in errors[0], errors
    output = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in output and "Traceback" not in output
    assert not (pytester.path / "ran").exists()


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["--memreport=out", f"--memreport-compare=./{LONG}"], "--memreport-compare"),
        (["--memreport=out", f"--memreport-compare=./{DEEP}"], "--memreport-compare"),
        (["--memreport=out", "--memreport-save", f"--memreport-storage={LONG}"], "storage"),
        (["--memreport=out", "--memreport-save", f"--memreport-storage={DEEP}"], "storage"),
        ([f"--memreport-json={LONG}"], "--memreport-json"),
        ([f"--memreport-json={DEEP}x.json"], "--memreport-json"),
        ([f"--memreport={LONG}"], "--memreport"),
        ([f"--memreport={DEEP}"], "--memreport"),
        (["--memreport=out", f"--memreport-save={'n' * 300}"], "--memreport-save"),
        (["--memreport=out", f"--memreport-save={'名' * 100}"], "--memreport-save"),
        (["--memreport=out", "--memreport-save=a_file"], "not a folder"),
        (["--memreport=a_file"], "not a folder"),
        (["--memreport=out", "--memreport-json=out/summary.json"], "--memreport-json"),
    ],
    ids=[
        "compare-long",
        "compare-deep",
        "storage-long",
        "storage-deep",
        "json-long",
        "json-deep",
        "memreport-long",
        "memreport-deep",
        "save-300-bytes",
        "save-100-cjk",
        "save-a-file",
        "memreport-a-file",
        "json-among-verdicts",
    ],
)
def test_a_path_or_name_that_cannot_work_is_refused_before_any_test_runs(pytester, args, text):
    pytester.makepyfile(test_ran=RAN)
    (pytester.path / "a_file").write_text("x")
    (pytester.path / ".leakgate").mkdir()
    (pytester.path / ".leakgate" / "a_file").write_text("x")
    refused(pytester.runpytest("-p", "no:randomly", *args), pytester, text)


def test_the_summary_is_never_one_of_the_sessions_verdicts(pytester):
    project(pytester, keep=False)
    assert pytester.runpytest("-p", "no:randomly", "--memreport=out").ret == 0
    verdict = pytester.path / "out" / f"{safe_name('test_loop.py::test_loop_clean')}.json"
    before = verdict.read_text()
    result = pytester.runpytest(
        "-p", "no:randomly", "--memreport=out", f"--memreport-json={verdict}"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert verdict.read_text() == before


@pytest.mark.parametrize("given", ["./R", "R/"])
def test_comparing_with_the_sessions_own_report_folder_is_refused(pytester, given):
    project(pytester, keep=False)
    assert pytester.runpytest("-p", "no:randomly", "--memreport=R").ret == 0
    project(pytester, keep=True)
    result = pytester.runpytest(
        "-p", "no:randomly", "--memreport=R", f"--memreport-compare={given}"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--memreport-compare*the folder this session writes into*"])


def test_a_named_baseline_that_is_the_report_folder_is_refused(pytester):
    project(pytester, keep=False)
    args = ["-p", "no:randomly", "--memreport=.leakgate/base"]
    assert pytester.runpytest(*args, "--memreport-save=base").ret == pytest.ExitCode.USAGE_ERROR
    assert (
        pytester.runpytest("-p", "no:randomly", "--memreport=out", "--memreport-save=base").ret == 0
    )
    result = pytester.runpytest(*args, "--memreport-compare=base")
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_a_summary_path_that_links_to_dev_null_stays_a_link(pytester):
    project(pytester, keep=False)
    link = pytester.path / "summary.json"
    link.symlink_to(os.devnull)
    result = pytester.runpytest("-p", "no:randomly", f"--memreport-json={link}")
    assert result.ret == 0
    assert link.is_symlink() and os.readlink(link) == os.devnull
    result.stdout.fnmatch_lines([f"leakgate: session summary in {link}"])


def test_a_summary_path_that_is_a_fifo_is_written_as_a_stream(pytester):
    import threading

    project(pytester, keep=False)
    fifo = pytester.path / "summary.fifo"
    os.mkfifo(fifo)
    read = []
    reader = threading.Thread(target=lambda: read.append(fifo.read_bytes()), daemon=True)
    reader.start()
    result = pytester.runpytest("-p", "no:randomly", f"--memreport-json={fifo}")
    reader.join(timeout=60)
    assert result.ret == 0
    assert fifo.is_fifo() and json.loads(read[0])["schema"] == "leakgate-session/1"


def test_a_summary_path_that_links_to_a_regular_file_is_refused_and_the_file_kept(pytester):
    pytester.makepyfile(test_ran=RAN)
    kept = pytester.path / "kept.txt"
    kept.write_text("mine")
    link = pytester.path / "summary.json"
    link.symlink_to(kept)
    refused(pytester.runpytest(f"--memreport-json={link}"), pytester, "--memreport-json")
    assert link.is_symlink() and kept.read_text() == "mine"


def test_a_baseline_name_planted_as_a_link_out_of_the_storage_is_refused(pytester):
    pytester.makepyfile(test_ran=RAN)
    outside = pytester.path / "outside"
    outside.mkdir()
    (pytester.path / ".leakgate").mkdir()
    (pytester.path / ".leakgate" / "base").symlink_to(outside)
    for option in ("--memreport-save=base", "--memreport-compare=base"):
        result = pytester.runpytest("-p", "no:randomly", "--memreport=out", option)
        refused(result, pytester, "a link")
    assert list(outside.iterdir()) == []


PLANTS = """
import os
import pytest


@pytest.mark.memleak(phase="loop", max_growth="1GiB", warmup=0)
def test_plants_a_link(memtrace):
    with memtrace.phase("loop", epoch=0):
        for i in range(8):
            memtrace.checkpoint("BATCH", batch=i)
    os.makedirs(".leakgate", exist_ok=True)
    os.symlink(os.path.abspath("outside"), ".leakgate/base")
"""


def test_a_link_planted_during_the_session_is_not_followed_when_saving(pytester):
    pytester.makepyfile(test_plants=PLANTS)
    (pytester.path / "outside").mkdir()
    result = pytester.runpytest("-p", "no:randomly", "--memreport=out", "--memreport-save=base")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["leakgate warning: the baseline was not saved (*base*link*)"])
    assert list((pytester.path / "outside").iterdir()) == []


def test_a_baseline_a_full_disk_left_partial_is_never_compared_as_whole(pytester, monkeypatch):
    project(pytester, keep=False)
    written = []
    real = baseline.write_atomic

    def fills_up(path, data):  # the manifest that says "saving", then one verdict
        if len(written) == 2:
            raise OSError(28, "No space left on device", str(path))
        written.append(path)
        return real(path, data)

    with monkeypatch.context() as patched:  # (monkeypatch.undo would undo pytester's chdir)
        patched.setattr(baseline, "write_atomic", fills_up)
        saving = pytester.runpytest("-p", "no:randomly", "--memreport=out", "--memreport-save")
    assert saving.ret == pytest.ExitCode.TESTS_FAILED
    kept = pytester.path / ".leakgate" / "baseline"
    assert len(list(kept.glob("*.json"))) == 1

    project(pytester, keep=True)  # the test whose verdict was not saved regresses
    result = pytester.runpytest("-p", "no:randomly", "--memreport=out", "--memreport-compare")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*baseline*incomplete*"])


def test_a_complete_save_lists_its_verdicts_and_a_resave_replaces_the_list(pytester):
    project(pytester, keep=False)
    args = ["-p", "no:randomly", "--memreport=out"]
    assert pytester.runpytest(*args, "--memreport-save").ret == 0
    kept = pytester.path / ".leakgate" / "baseline"
    listed = json.loads((kept / baseline.MANIFEST).read_text())["verdicts"]
    assert listed == sorted(p.name for p in kept.glob("*.json")) and len(listed) == 2
    # a verdict that is not in the list makes the baseline incomplete as well
    (kept / "stray.json").write_text((kept / listed[0]).read_text())
    result = pytester.runpytest(*args, "--memreport-compare")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    (kept / "stray.json").unlink()
    assert pytester.runpytest(*args, "--memreport-compare").ret == 0


def test_the_gate_refuses_a_baseline_whose_save_did_not_finish(tmp_path, capsys):
    from test_cli import clean, saved

    from harness._frontends.cli import main

    runs, base = tmp_path / "runs", tmp_path / "base"
    runs.mkdir(), base.mkdir()
    saved(runs, "a", clean())
    baseline.save_baseline(base, {"a.json": json.loads((runs / "a.json").read_text())})
    assert main(["gate", str(runs), "--baseline", str(base)]) == 0
    (base / baseline.MANIFEST).write_text(
        json.dumps({"schema": "leakgate-baseline/1", "saving": True})
    )
    capsys.readouterr()
    assert main(["gate", str(runs), "--baseline", str(base)]) == 2
    assert "incomplete baseline" in capsys.readouterr().err
    assert "Gate: REFUSED" in (runs / "index.md").read_text()

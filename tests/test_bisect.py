"""``leakgate bisect``: the first commit whose test fails its memory verdict, found by ``git
bisect run`` in a repository made here (a leak planted at a known commit), or read from a
history that holds both sides."""

import datetime
import subprocess
import sys
from pathlib import Path

import pytest

from harness._frontends.cli import main
from harness._history.archive import HistoryPlace, HistoryRow, append, open_history

LOOP = """
import pytest
import torch

KEPT = []


@pytest.mark.memleak(phase="{phase}", max_growth="4MB", warmup=2)
def test_loop(memtrace):
    with memtrace.phase("train", epoch=0):
        for i in range(12):
            x = torch.ones(256 * 1024)  # 1 MiB a batch
            {keep}
            memtrace.checkpoint("TRAIN_BATCH", batch=i)
"""
TEST = "test_leak.py::test_loop"


def repository_root():
    return Path(git("rev-parse", "--show-toplevel", cwd="."))


PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]


def git(*args, cwd):
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def repository(tmp_path, monkeypatch):
    """A repository of six commits whose test leaks from commit 3 on; its commits, oldest
    first. The working directory is the repository."""
    for who in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{who}_NAME", "Test Author")
        monkeypatch.setenv(f"GIT_{who}_EMAIL", "author@example.com")
        monkeypatch.setenv(f"GIT_{who}_DATE", "2026-01-01T00:00:00+00:00")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/dev/null")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    repo = tmp_path / "repo"
    repo.mkdir()
    git("init", "-q", "-b", "main", cwd=repo)
    commits = []
    for i in range(6):
        keep = "KEPT.append(x)" if i >= 3 else "del x"
        (repo / "test_leak.py").write_text(LOOP.format(phase="train", keep=keep))
        (repo / "step.txt").write_text(f"{i}\n")
        git("add", "test_leak.py", "step.txt", cwd=repo)
        git("commit", "-q", "-m", f"step {i}" + (" keeps every batch" if i == 3 else ""), cwd=repo)
        commits.append(git("rev-parse", "HEAD", cwd=repo))
    monkeypatch.chdir(repo)
    return commits


def test_bisect_finds_the_commit_that_planted_the_leak(repository, capsys):
    code = main(["bisect", repository[0], repository[-1], "--", *PYTEST, TEST])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"first bad commit: {repository[3]} (run here)" in out
    assert "step 3 keeps every batch" in out
    assert "held by `test_leak.KEPT` (list" in out
    assert git("rev-parse", "HEAD", cwd=".") == repository[-1]  # the bisect was reset
    assert not (repository_root() / ".git" / "BISECT_START").exists()


def test_bisect_reads_the_history_first_where_it_holds_both_sides(repository, tmp_path, capsys):
    here = HistoryPlace.here()
    history = open_history(tmp_path / "history", mode="append")
    for i, commit in enumerate(repository):
        status = "FAIL" if i >= 3 else "PASS"
        row = HistoryRow(
            commit=commit,
            dirty=False,
            branch="main",
            time=datetime.datetime(2026, 1, 1, i, tzinfo=datetime.UTC),
            run=f"run{i}",
            source="test",
            test=TEST,
            metric="allocated",
            growth=0.0,
            peak=0.0,
            teardown=None,
            status=status,
            holder="held by `test_leak.KEPT` (list, 12 items, 8.0MiB)" if i >= 3 else None,
            fingerprint="f",
            device="cpu",
            device_model="m",
            torch="t",
            cpu_model=here.cpu_model,
            cores=here.cores,
        )
        append(history, [row])
    argv = ["bisect", repository[0], repository[-1], "--history", str(tmp_path / "history")]
    assert main([*argv, "--", "false", TEST]) == 0  # the command is never run
    out = capsys.readouterr().out
    assert f"first bad commit: {repository[3]} (from the history)" in out
    assert "test_leak.KEPT" in out


def test_a_step_skips_a_commit_whose_verdict_is_an_error(repository, tmp_path, capsys):
    (tmp_path / "repo" / "test_leak.py").write_text(LOOP.format(phase="nope", keep="del x"))
    state = tmp_path / "state"
    state.mkdir()
    assert main(["bisect-step", "--state", str(state), "--", *PYTEST, TEST]) == 125
    (found,) = (state / "commits").iterdir()
    assert found.name == f"{repository[-1]}.json" and '"ERROR"' in found.read_text()


def test_a_wrong_test_id_is_refused_at_bad_after_one_run(repository, capsys):
    assert main(["bisect", repository[0], repository[-1], "--", *PYTEST, "test_leak.py::nope"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: BAD: no memory verdict at {repository[-1][:12]}: exit 4")
    assert line.endswith("ERROR: not found: " + str(Path.cwd() / "test_leak.py::nope"))
    assert git("rev-parse", "HEAD", cwd=".") == repository[-1]
    assert git("status", "--porcelain", cwd=".") == ""
    assert not (repository_root() / ".git" / "BISECT_START").exists()


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["bisect", "nope", "HEAD", "--", "pytest", TEST], "GOOD: not a commit here"),
        (["bisect", "HEAD~1", "HEAD"], "no test command"),
        (["bisect", "HEAD", "HEAD~2", "--", "pytest", TEST], "not an ancestor"),
    ],
    ids=["not-a-commit", "no-command", "reversed"],
)
def test_bisect_refuses_bad_input_with_one_line(repository, capsys, argv, text):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and text in err, err


def test_bisect_outside_a_repository_is_bad_input(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["bisect", "a", "b", "--", "pytest", TEST]) == 2
    assert "not inside a git work tree" in capsys.readouterr().err

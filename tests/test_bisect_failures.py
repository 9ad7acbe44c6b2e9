"""``leakgate bisect`` when things go wrong, through the command on small repositories made
here: a signal (SIGTERM as a CI step's timeout sends it, Ctrl-C as a terminal sends it), a kill,
a command without a verdict, a run from a subfolder, a working tree a checkout would overwrite.
Whatever happens, the repository is left as the user had it: HEAD, its branch, the stash, the
working tree, no bisect under way, no folder of leakgate's left behind.

The test command is a small script that answers what ``verdict.txt`` says at each commit
(PASS, FAIL, or nothing), so a bisect takes a second; it can stop at its Nth run (writing a
marker file first) until a FIFO is written to, which is where the signals are sent."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

FAKE = """
import json, os, sys
from pathlib import Path

reports = Path(sys.argv[-1].split("=", 1)[1])
kind = Path(sys.argv[1]).read_text().strip()
runs = Path(os.environ["FAKE_RUNS"])
with runs.open("a") as out:
    out.write(kind + "\\n")
if os.environ.get("FAKE_SCRIBBLE"):  # a test that writes into a tracked file
    with open(os.environ["FAKE_SCRIBBLE"], "a") as out:
        out.write("written by the test\\n")
if len(runs.read_text().splitlines()) == int(os.environ.get("FAKE_STOP_AT", "0")):
    marker = Path(os.environ["FAKE_MARKER"])
    here = {"pid": os.getpid(), "group": os.getpgid(0), "step": os.getppid()}
    here["step_group"] = os.getpgid(here["step"])
    marker.with_suffix(".tmp").write_text(json.dumps(here))
    marker.with_suffix(".tmp").rename(marker)
    with open(os.environ["FAKE_RELEASE"]) as release:  # a FIFO: waits for a writer
        release.read()
if kind in ("PASS", "FAIL", "ERROR"):
    verdict = {"schema_version": 2, "status": kind, "rules": {}, "findings": [], "phases": [],
               "checks": []}
    (reports / "test.json").write_text(json.dumps(verdict))
"""

WAIT = 120.0
"""Seconds a test waits for a marker or for the command before it fails (a bound, never what
makes it pass)."""


def git(*args, cwd, check=True):
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=check)
    return done.stdout.strip() if check else done


class Repo:
    """A repository whose commits carry ``verdict.txt`` (what the fake test answers there), the
    fake test, and how to run ``leakgate bisect`` on it."""

    def __init__(self, root: Path, verdicts: list[str]):
        self.root, self.path = root, root / "repo"
        self.path.mkdir()
        (root / "tmp").mkdir()
        self.fake = root / "fake_test.py"
        self.fake.write_text(FAKE)
        self.runs, self.marker, self.release = root / "runs", root / "marker", root / "release"
        os.mkfifo(self.release)
        git("init", "-q", "-b", "main", cwd=self.path)
        (self.path / "sub").mkdir()
        (self.path / "sub" / "keep.txt").write_text("a folder in every commit\n")
        (self.path / "notes.txt").write_text("never changed by a commit\n")
        self.commits = []
        for i, verdict in enumerate(verdicts):
            (self.path / "verdict.txt").write_text(f"{verdict}\n")
            (self.path / "data.txt").write_text(f"{i}\n")
            if i == 2:
                (self.path / "middle.txt").write_text("in commits 2 to 4 only\n")
            elif i == 5:
                (self.path / "middle.txt").unlink()
            git("add", "-A", cwd=self.path)
            git("commit", "-q", "-m", f"step {i}: {verdict}", cwd=self.path)
            self.commits.append(git("rev-parse", "HEAD", cwd=self.path))
        # what a user has around: a stash entry, and a change no commit in the range touches
        (self.path / "notes.txt").write_text("stashed\n")
        git("stash", "-q", cwd=self.path)
        (self.path / "notes.txt").write_text("my own edit\n")
        self.before = self.snapshot()

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ, TMPDIR=str(self.root / "tmp"), FAKE_RUNS=str(self.runs))
        env.update(FAKE_MARKER=str(self.marker), FAKE_RELEASE=str(self.release), **extra)
        return env

    def argv(self, *options: str, good: int = 0, bad: int = -1, test=("verdict.txt",)):
        command = [sys.executable, str(self.fake), *test]
        good_bad = [self.commits[good], self.commits[bad]]
        return [sys.executable, "-m", "harness", "bisect", *options, *good_bad, "--", *command]

    def bisect(self, *options: str, cwd=None, env=None, **where) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.argv(*options, **where),
            cwd=cwd or self.path,
            env=env or self.env(),
            capture_output=True,
            text=True,
            timeout=WAIT,
        )

    def ran(self) -> int:
        return len(self.runs.read_text().splitlines()) if self.runs.exists() else 0

    def snapshot(self) -> dict[str, str]:
        """What the user had: HEAD, its branch, the stash, the working tree's state."""
        return {
            "head": git("rev-parse", "HEAD", cwd=self.path),
            "branch": git("symbolic-ref", "HEAD", cwd=self.path),
            "stash": git("stash", "list", "--format=%H %s", cwd=self.path),
            "status": git("status", "--porcelain", "--untracked-files=all", cwd=self.path),
            "notes": (self.path / "notes.txt").read_text(),
        }

    def assert_as_the_user_left_it(self) -> None:
        assert self.snapshot() == self.before
        assert git("bisect", "log", cwd=self.path, check=False).returncode != 0  # no bisect
        assert not (self.path / ".git" / "leakgate-bisect").exists()
        assert not list((self.root / "tmp").glob("leakgate-bisect*"))


@pytest.fixture
def make_repo(tmp_path, monkeypatch):
    for who in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{who}_NAME", "Test Author")
        monkeypatch.setenv(f"GIT_{who}_EMAIL", "author@example.com")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/dev/null")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    made = []

    def make(verdicts):
        made.append(Repo(tmp_path, verdicts))
        return made[-1]

    yield make
    for repo in made:  # what a failing test may have left running
        if repo.marker.exists():
            here = json.loads(repo.marker.read_text())
            for group in (here["group"], here["step_group"]):
                _kill_group(group)


LEAK_AT_5 = ["PASS"] * 5 + ["FAIL"] * 3
"""Eight commits; the test fails from commit 5 on."""


def _kill_group(group: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)


def _wait_until_gone(pid: int) -> None:
    """Wait (within :data:`WAIT`) until process ``pid``, not a child of this one, has ended."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return
        if state in ("Z", "X"):
            return
        assert time.monotonic() < deadline, f"process {pid} still runs"
        time.sleep(0.02)


def _started(repo: Repo, stop_at: int) -> subprocess.Popen:
    """``leakgate bisect`` started in a session of its own (as a terminal's job is), once the
    fake test's ``stop_at``-th run is waiting."""
    driver = subprocess.Popen(
        repo.argv(),
        cwd=repo.path,
        env=repo.env(FAKE_STOP_AT=str(stop_at)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + WAIT
    while not repo.marker.exists():  # the fake test writes it once it waits
        assert driver.poll() is None, driver.communicate()
        assert time.monotonic() < deadline, "the fake test never started"
        time.sleep(0.02)
    return driver


def test_a_bisect_names_the_first_bad_commit_and_leaves_the_user_s_things(make_repo):
    repo = make_repo(LEAK_AT_5)
    done = repo.bisect()
    assert done.returncode == 0, done.stderr
    assert f"first bad commit: {repo.commits[5]} (run here)" in done.stdout
    assert f"bisect: {repo.commits[-1][:12]} FAIL" in done.stdout  # a line per commit judged
    assert done.stderr == ""
    repo.assert_as_the_user_left_it()


def test_ends_next_to_each_other(make_repo):
    repo = make_repo(LEAK_AT_5)
    done = repo.bisect(good=4, bad=5)
    assert done.returncode == 0, done.stderr
    assert f"first bad commit: {repo.commits[5]} (run here)" in done.stdout
    assert repo.ran() == 2
    repo.assert_as_the_user_left_it()


@pytest.mark.parametrize(
    ("number", "to_group"), [(signal.SIGTERM, False), (signal.SIGINT, True)], ids=["TERM", "INT"]
)
@pytest.mark.parametrize("stop_at", [1, 3], ids=["judging-BAD", "in-git-bisect-run"])
def test_a_signal_puts_everything_back(make_repo, number, to_group, stop_at):
    """SIGTERM sent to leakgate alone (a CI step's timeout), SIGINT to its process group (Ctrl-C
    in a terminal), while an end is judged or while git bisects."""
    repo = make_repo(LEAK_AT_5)
    driver = _started(repo, stop_at)
    (os.killpg if to_group else os.kill)(driver.pid, number)
    _, err = driver.communicate(timeout=WAIT)
    assert driver.returncode == 128 + number, err
    short = repo.commits[-1][:7]
    name = signal.Signals(number).name
    assert err.splitlines() == [
        f"leakgate bisect: stopped by {name}; put back main at {short} and ended git's bisect"
    ]
    repo.assert_as_the_user_left_it()
    test = json.loads(repo.marker.read_text())["pid"]
    with pytest.raises(ProcessLookupError):  # the test was stopped, and waited for
        os.kill(test, 0)


def test_a_killed_bisect_is_ended_by_the_next_run(make_repo):
    """Everything killed at once (SIGKILL, nothing can put anything back): no folder is left in
    the temporary folder, and the next run ends git's bisect, removes the killed run's folder
    and bisects."""
    repo = make_repo(LEAK_AT_5)
    driver = _started(repo, 3)
    here = json.loads(repo.marker.read_text())
    for group in (here["group"], here["step_group"]):
        _kill_group(group)
    driver.kill()
    driver.communicate(timeout=WAIT)
    assert git("bisect", "log", cwd=repo.path, check=False).returncode == 0  # left under way
    assert not list((repo.root / "tmp").glob("leakgate-bisect*"))
    repo.marker.unlink()
    done = repo.bisect()
    assert done.returncode == 0, done.stderr
    assert f"first bad commit: {repo.commits[5]} (run here)" in done.stdout
    assert done.stderr.splitlines() == [
        "leakgate bisect: a killed bisect was left under way: put back main at "
        f"{repo.commits[-1][:7]} and ended git's bisect"
    ]
    repo.assert_as_the_user_left_it()


def test_a_test_left_running_by_a_killed_bisect_marks_no_commit(make_repo):
    """leakgate alone killed while its test runs: the test ends, and its step stops git's
    bisect run instead of marking the commit; the next run ends the bisect."""
    repo = make_repo(LEAK_AT_5)
    driver = _started(repo, 3)
    here = json.loads(repo.marker.read_text())
    driver.kill()
    driver.wait(timeout=WAIT)  # (its stdout stays open: the step left running holds a copy)
    marked = git("bisect", "log", cwd=repo.path)
    with open(repo.release, "w") as release:  # the waiting test goes on
        release.write("go")
    _wait_until_gone(here["step_group"])  # git bisect run, the step's group leader
    assert git("bisect", "log", cwd=repo.path) == marked
    assert repo.ran() == 3
    driver.stdout.close()
    driver.stderr.close()
    repo.marker.unlink()
    assert repo.bisect().returncode == 0
    repo.assert_as_the_user_left_it()


def test_a_second_bisect_in_the_same_working_tree_is_refused(make_repo):
    repo = make_repo(LEAK_AT_5)
    driver = _started(repo, 3)
    done = repo.bisect()
    assert done.returncode == 2
    assert done.stderr == (
        f"error: a leakgate bisect (pid {driver.pid}) is running in this working tree\n"
    )
    driver.terminate()
    driver.communicate(timeout=WAIT)
    assert driver.returncode == 128 + signal.SIGTERM
    repo.assert_as_the_user_left_it()


def test_a_command_that_does_not_exist_is_refused_at_bad(make_repo):
    repo = make_repo(LEAK_AT_5)
    argv = repo.argv()
    argv[argv.index("--") + 1 :] = ["no-such-command-here", "x"]
    done = subprocess.run(argv, cwd=repo.path, env=repo.env(), capture_output=True, text=True)
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line == (
        f"error: BAD: no memory verdict at {repo.commits[-1][:12]}: "
        "command not found: no-such-command-here"
    )
    repo.assert_as_the_user_left_it()


def test_a_good_end_without_a_verdict_is_refused(make_repo):
    repo = make_repo(["NONE"] + ["FAIL"] * 3)
    done = repo.bisect()
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"error: GOOD: no memory verdict at {repo.commits[0][:12]}: exit 0")
    assert repo.ran() == 2
    repo.assert_as_the_user_left_it()


@pytest.mark.parametrize("limit", [None, 1])
def test_commits_in_a_row_without_a_verdict_stop_the_bisect(make_repo, limit):
    repo = make_repo(["PASS"] + ["NONE"] * 6 + ["FAIL"])
    options = () if limit is None else ("--max-no-verdict", str(limit))
    done = repo.bisect(*options)
    limit = limit or 3
    assert done.returncode == 1, done.stderr
    assert f"bisect: stopped after {limit} commits in a row without a verdict" in done.stdout
    assert "exit 0, no verdict written" in done.stdout
    assert repo.ran() == 2 + limit  # both ends, then the silent ones
    repo.assert_as_the_user_left_it()


@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_limit_below_one_is_bad_input(make_repo, value):
    repo = make_repo(LEAK_AT_5)
    done = repo.bisect("--max-no-verdict", value)
    assert done.returncode == 2
    assert done.stderr == f"error: --max-no-verdict: expected 1 or more, got {value}\n"
    assert repo.ran() == 0


@pytest.mark.parametrize(("end", "verdicts"), [("BAD", ["PASS"] * 4), ("GOOD", ["FAIL"] * 4)])
def test_an_end_with_the_other_verdict_ends_the_bisect(make_repo, end, verdicts):
    repo = make_repo(verdicts)
    done = repo.bisect()
    assert done.returncode == 1, done.stderr
    commit = repo.commits[-1 if end == "BAD" else 0][:12]
    assert f"bisect: {end} {commit} gives {verdicts[0]} here, not" in done.stdout
    repo.assert_as_the_user_left_it()


def test_run_from_a_subfolder_the_test_runs_there(make_repo):
    repo = make_repo(LEAK_AT_5)
    done = repo.bisect(cwd=repo.path / "sub", test=("../verdict.txt",))
    assert done.returncode == 0, done.stderr
    assert f"first bad commit: {repo.commits[5]} (run here)" in done.stdout
    repo.assert_as_the_user_left_it()


@pytest.mark.parametrize("staged", [False, True], ids=["changed", "staged"])
def test_a_change_a_checkout_would_overwrite_is_refused_by_name(make_repo, staged):
    repo = make_repo(LEAK_AT_5)
    (repo.path / "data.txt").write_text("my own data\n")
    if staged:
        git("add", "data.txt", cwd=repo.path)
    repo.before = repo.snapshot()
    done = repo.bisect()
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line == (
        "error: data.txt: changed, and a checkout between GOOD and BAD would overwrite it: "
        "commit or stash your changes (git stash), then run the bisect again"
    )
    assert repo.ran() == 0
    repo.assert_as_the_user_left_it()


def test_an_untracked_file_a_checkout_would_overwrite_is_refused_by_name(make_repo):
    repo = make_repo(LEAK_AT_5)
    (repo.path / "middle.txt").write_text("mine\n")  # the commits git bisects first have it
    repo.before = repo.snapshot()
    done = repo.bisect()
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line == (
        "error: middle.txt: not tracked, and a checkout between GOOD and BAD would overwrite it: "
        "move or remove it, then run the bisect again"
    )
    repo.assert_as_the_user_left_it()


def test_files_the_test_writes_are_put_back_between_commits(make_repo):
    repo = make_repo(LEAK_AT_5)
    done = repo.bisect(env=repo.env(FAKE_SCRIBBLE="data.txt"))
    assert done.returncode == 0, done.stderr
    assert f"first bad commit: {repo.commits[5]} (run here)" in done.stdout
    repo.assert_as_the_user_left_it()

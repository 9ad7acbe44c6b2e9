"""``leakgate bisect GOOD BAD -- pytest tests/test_x.py::test_y``: the first commit whose test
fails its memory verdict, by ``git bisect run``.

Each commit ``git bisect`` picks is judged by :func:`step` (``python -m harness bisect-step``):
the command runs with ``--memreport``, and its verdicts decide: a FAIL marks the commit bad
(exit 1), all PASS good (0), an ERROR or no verdict skips it (125). What each step found is kept
by commit, so the first bad commit is printed with its holder line. A history that holds runs of
the test on this machine's CPU narrows the range first.

Nothing a user had is left changed. A change that a checkout in the range would overwrite is
refused first, by name; both ends are judged before git bisects (a command without a verdict
there is refused), and a few commits in a row without one stop it; SIGINT, SIGTERM and SIGHUP
stop the test, end git's bisect (HEAD and its branch put back) and exit 128 + the signal. Git
runs from the top of the working tree, the test where leakgate was run. The bisect's files live
in the git folder (``leakgate-bisect``), where the next run ends what a killed one left.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

from harness._core.errors import BadInput, one_line
from harness._core.fsio import write_atomic
from harness._core.git import (
    changed_files,
    commit_of,
    git,
    git_names,
    git_or_refuse,
    git_path,
    git_said,
    head_text,
    work_tree_top,
)
from harness._verdict.model import Status

GOOD, BAD, SKIP, STOP = 0, 1, 125, 128
"""Exit codes as ``git bisect run`` reads them: good, bad, skip, and stop (128 or more)."""

NO_VERDICT = "NO VERDICT"
MAX_SILENT = 3
"""Commits in a row without a verdict after which a bisect stops (``--max-no-verdict``)."""

GRACE = 10.0
"""Seconds a stopped test, then git, have to end before they are killed."""

STATE = "leakgate-bisect"
"""The bisect's folder, in the git folder beside git's own ``BISECT_*`` files."""


def command_of(given: Sequence[str]) -> list[str]:
    """The test command as run: ``pytest`` as this Python's (whose plugin is leakgate's)."""
    if not given:
        raise BadInput("no test command: give it after --, e.g. -- pytest tests/test_x.py::test_y")
    if given[0] == "pytest":
        return [sys.executable, "-m", "pytest", *given[1:]]
    return list(given)


def step(command: Sequence[str], state: Path, driver: int | None = None) -> int:
    """Judge HEAD by the test command (where and how, as ``state/run.json`` says), keep what it
    found as ``state/commits/<commit>.json`` (a commit is judged once), and answer as ``git
    bisect run`` reads an exit code: STOP where its driver (``driver``, a pid) is stopping the
    bisect or gone, or too many commits in a row gave no verdict."""
    run: dict[str, Any] = _read(state / "run.json") or {}
    commit = git_or_refuse("rev-parse", "HEAD")
    record = state / "commits" / f"{commit}.json"
    found = _read(record)
    if found is None:
        if _stopping(state, driver):
            return STOP
        found = _judge(command, state, run.get("cwd"))
        if _stopping(state, driver):
            return STOP
        record.parent.mkdir(exist_ok=True)
        write_atomic(record, json.dumps(found))
        said = found.get("why") or found.get("holder")
        line = f"bisect: {commit[:12]} {found['status']}" + (f" ({said})" if said else "")
        with suppress(OSError, KeyError, TypeError):  # no copy of stdout to write to
            os.write(run["progress"], f"{line}\n".encode())
    if len(_silence(state, commit, found)) >= run.get("max_silent", MAX_SILENT):
        return STOP
    return {Status.FAIL: BAD, Status.PASS: GOOD}.get(found["status"], SKIP)


def bisect(
    good: str,
    bad: str,
    command: Sequence[str],
    history: str | None = None,
    max_silent: int | None = None,
) -> int:
    """Find and print the first bad commit between ``good`` and ``bad``; 0 when one is named,
    1 when none could be (an end that does not fail or pass, every candidate skipped, too many
    without a verdict), 128 + the signal when a signal stopped it."""
    command_of(command)
    if max_silent is not None and max_silent < 1:
        raise BadInput(f"expected 1 or more, got {max_silent}", field="--max-no-verdict")
    top = work_tree_top()
    state = git_path(STATE, top)
    result, session = 1, None
    with _Signals() as signals:
        try:
            _recover(top, state)
            if _bisect_id(top) is not None:
                raise BadInput("a git bisect is already under way: end it with git bisect reset")
            good, bad = commit_of(good, "GOOD", top), commit_of(bad, "BAD", top)
            path = git_or_refuse("rev-list", "--ancestry-path", f"{good}..{bad}", cwd=top).split()
            if not path:
                raise BadInput("GOOD is not an ancestor of BAD: nothing to bisect")
            if history is not None:
                with signals.waiting():
                    good, bad, known = _narrowed(history, command, good, path[::-1])
                if known is not None:
                    return _print(bad, known, "from the history", top)
            _check_tree(top, good, bad)
            session = _Session(top, state, signals, command, max_silent or MAX_SILENT)
            result = session.run(good, bad, len(path) + 1)
        except KeyboardInterrupt:  # a signal, noted in signals.caught
            pass
        except OSError as exc:  # the bisect's own folder, in the git folder
            raise BadInput(f"cannot bisect here: {one_line(exc)}") from None
        finally:
            ended, back = session.close() if session else (True, "nothing was changed")
        if signals.caught:
            name = signal.Signals(signals.caught).name
            print(f"leakgate bisect: stopped by {name}; {back}", file=sys.stderr)
            return 128 + signals.caught
    if not ended:
        print(f"leakgate bisect: {back}", file=sys.stderr)
    return result


class _Signals:
    """SIGINT, SIGTERM and SIGHUP while a bisect runs: noted, and a KeyboardInterrupt at once
    where leakgate waits (for the test, for git), else after the git command under way."""

    def __init__(self) -> None:
        self.caught: int | None = None
        self._armed = False
        self._before: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                self._before[number] = signal.signal(number, self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        for number, handler in self._before.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)

    def _note(self, number: int, frame: object) -> None:
        self.caught = self.caught or number
        if self._armed:
            self._armed = False
            raise KeyboardInterrupt

    def check(self) -> None:
        """Stop now if a signal came."""
        if self.caught:
            raise KeyboardInterrupt

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """A signal stops the body at once (it waits, and moves nothing)."""
        self._armed = True
        try:
            self.check()
            yield
        finally:
            self._armed = False


class _Session:
    """One bisect under way: its folder, the child leakgate waits for, and what to put back."""

    def __init__(
        self, top: Path, state: Path, signals: _Signals, command: Sequence[str], max_silent: int
    ) -> None:
        state.mkdir()  # one leakgate bisect at a time in a working tree
        self.top, self.state, self.signals = top, state, signals
        self.home = head_text(top)
        self.child: subprocess.Popen[bytes] | None = None
        self.started = False
        self.progress: int | None = None  # a copy of stdout for the steps' lines
        with suppress(OSError, ValueError, AttributeError):  # a stdout with no file under it
            self.progress = os.dup(sys.stdout.fileno())
        pid = os.getpid()
        self.step = [sys.executable, "-P", "-m", "harness", "bisect-step", "--state", str(state)]
        self.step += ["--driver", str(pid), "--", *command]
        self.run_file: dict[str, Any] = {"driver": pid, "since": _started(pid), "cwd": os.getcwd()}
        self.run_file.update(max_silent=max_silent, progress=self.progress)

    def run(self, good: str, bad: str, commits: int) -> int:
        """Start git's bisect, judge both ends, let ``git bisect run`` do the rest; the code."""
        write_atomic(self.state / "run.json", json.dumps(self.run_file))
        self.signals.check()
        git_or_refuse("bisect", "start", bad, good, cwd=self.top)
        self.started = True
        self.run_file["bisect"] = _bisect_id(self.top)
        write_atomic(self.state / "run.json", json.dumps(self.run_file))
        for end, what, wanted in ((bad, "BAD", Status.FAIL), (good, "GOOD", Status.PASS)):
            status = self._end(end, what)
            if status != wanted:
                print(f"bisect: {what} {end[:12]} gives {status} here, not {wanted}: no bisect")
                return 1
        self._wait(["git", "bisect", "run", *self.step])
        said = (self.state / "run.log").read_text(errors="replace")
        first = git("rev-parse", "--verify", "--quiet", "refs/bisect/bad", cwd=self.top)
        found = _read(self.state / "commits" / f"{first}.json") if first else None
        tried = len(list((self.state / "commits").glob("*.json")))
        print(f"bisect: ran the test at {tried} of {commits} commits")
        silent = _read(self.state / "silent.json") or []
        if len(silent) >= self.run_file["max_silent"]:
            commit, why = silent[-1]
            print(
                f"bisect: stopped after {len(silent)} commits in a row without a verdict "
                f"(the last, {commit[:12]}: {why})"
            )
            return 1
        if "is the first bad commit" not in said or found is None:
            why = "the commits left were skipped" if "skip" in said else git_said(said)
            print(f"bisect: no first bad commit could be named ({why})")
            return 1
        return _print(str(first), found.get("holder"), "run here", self.top)

    def _end(self, commit: str, what: str) -> str:
        """Judge one end of the range: its status; one without a verdict is bad input."""
        git_or_refuse("checkout", "--quiet", commit, cwd=self.top)
        code = self._wait(self.step)
        found = _read(self.state / "commits" / f"{commit}.json")
        if found is None:
            said = git_said((self.state / "run.log").read_text(errors="replace"))
            raise BadInput(f"the step at {commit[:12]} ended with exit {code}: {said}", field=what)
        if found["status"] == NO_VERDICT:
            raise BadInput(f"no memory verdict at {commit[:12]}: {found['why']}", field=what)
        return str(found["status"])

    def _wait(self, args: list[str]) -> int:
        """Run ``args`` at the top of the working tree and wait, stopped by a signal."""
        sys.stdout.flush()  # the steps' lines come after leakgate's own
        with open(self.state / "run.log", "wb") as log:
            self.child = _spawn(args, self.top, log, self.progress)
        with self.signals.waiting():
            code = self.child.wait()
        self.child = None
        return code

    def close(self) -> tuple[bool, str]:
        """Stop what runs, end git's bisect, remove the folder: whether HEAD and its branch are
        back, and a line that says so."""
        self._halt()
        ended, back = _end_bisect(self.top, self.home) if self.started else (True, "")
        shutil.rmtree(self.state, ignore_errors=True)
        if self.progress is not None:
            os.close(self.progress)
        return ended, back or "nothing was changed"

    def _halt(self) -> None:
        """Ask the step to stop and stop its test (SIGTERM; SIGKILL for all that is left after
        :data:`GRACE`), then wait for the step or ``git bisect run`` to end."""
        child, self.child = self.child, None
        if child is None:
            return
        (self.state / "stop").touch()
        _signal_group(_read(self.state / "test.json"), signal.SIGTERM)
        try:
            child.wait(GRACE)
        except subprocess.TimeoutExpired:
            _signal_group(child.pid, signal.SIGKILL)
            child.wait()
        for group in (child.pid, _read(self.state / "test.json")):  # what is left behind
            _signal_group(group, signal.SIGKILL)


def _judge(command: Sequence[str], state: Path, cwd: str | None) -> dict[str, Any]:
    """Run the test command at HEAD and read its verdicts. Files git tracks that the command
    changed (clean before it) are put back, so that git can check out the next commit."""
    from harness._history.archive import history_summary
    from harness._results.artifacts import load_run_document, verdict_files

    reports = state / "reports"
    shutil.rmtree(reports, ignore_errors=True)
    reports.mkdir()
    if cwd is not None and not Path(cwd).is_dir():
        return {"status": NO_VERDICT, "why": f"{cwd} is not a folder at this commit"}
    log, running = state / "test.log", state / "test.json"
    before = changed_files()
    try:
        with open(log, "wb") as out:
            test = _spawn([*command_of(command), f"--memreport={reports}"], cwd, out, None)
    except FileNotFoundError:
        return {"status": NO_VERDICT, "why": f"command not found: {command[0]}"}
    except OSError as exc:
        return {"status": NO_VERDICT, "why": f"cannot run {command[0]}: {exc.strerror or exc}"}
    write_atomic(running, json.dumps(test.pid))
    if _stopping(state, None):  # the driver may have looked before the file was there
        _signal_group(test.pid, signal.SIGTERM)
    code = test.wait()
    if _read(running) == test.pid:  # (a run that ended a killed one may have its own there)
        running.unlink()
    changed = changed_files() - before
    if changed:
        git("checkout", "--quiet", "HEAD", "--", *sorted(changed))
    documents = []
    for path in verdict_files(reports):
        with suppress(BadInput):
            documents.append(load_run_document(path))
    failed = [d for d in documents if d.get("status") == Status.FAIL]
    if failed:
        return {"status": Status.FAIL, "holder": history_summary(failed[0])["holder"]}
    if not documents:
        return {"status": NO_VERDICT, "why": _why(log, code)}
    passed = all(d.get("status") == Status.PASS for d in documents)
    return {"status": Status.PASS if passed else Status.ERROR, "holder": None}


def _spawn(args: list[str], cwd: Any, log: IO[bytes], fd: int | None) -> subprocess.Popen[bytes]:
    """``args`` started in ``cwd`` in a process group of its own (a terminal's Ctrl-C reaches
    leakgate alone, which stops the rest in order), its output into ``log``, ``fd`` kept open."""
    return subprocess.Popen(
        args,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        process_group=0,
        pass_fds=() if fd is None else (fd,),
    )


def _why(log: Path, code: int) -> str:
    """Why a command wrote no verdict: its exit code and its last line that says error (its last
    line when none does)."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if line.lower().startswith("error")]
    return f"exit {code}, no verdict written: {(errors or lines or ['no output'])[-1][:200]}"


def _silence(state: Path, commit: str, found: dict[str, Any]) -> list[list[str]]:
    """The commits judged in a row without a verdict, up to ``commit`` (kept in the state)."""
    path = state / "silent.json"
    silent: list[list[str]] = _read(path) or []
    if found["status"] != NO_VERDICT:
        silent = []
    elif commit not in (c for c, _ in silent):
        silent.append([commit, found["why"]])
    write_atomic(path, json.dumps(silent))
    return silent


def _stopping(state: Path, driver: int | None) -> bool:
    """Whether the bisect is being stopped: its driver asked, is gone, or another run holds the
    folder now (the driver was killed, and a new run ended what it left)."""
    if (state / "stop").exists():
        return True
    run = _read(state / "run.json") or {}
    return driver is not None and (run.get("driver") != driver or _started(driver) != run["since"])


def _signal_group(pid: Any, number: int) -> None:
    if isinstance(pid, int) and pid > 1:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, number)


def _started(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks after boot, from /proc; "" where there is no
    /proc to say), or None when no such process runs (a zombie is none)."""
    try:
        os.kill(pid, 0)
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except ProcessLookupError:
        return None
    except OSError:  # a process of another user, or no /proc
        return ""
    return None if fields[0] in ("Z", "X") else fields[19]


def _recover(top: Path, state: Path) -> None:
    """What a leakgate bisect that was killed left: its folder removed, and git's bisect ended
    where that run started it (nothing has been done in the repository since)."""
    if not state.exists():
        return
    owner = _read(state / "run.json") or {}
    driver = owner.get("driver")
    if isinstance(driver, int) and _started(driver) in (owner.get("since"), ""):
        raise BadInput(f"a leakgate bisect (pid {driver}) is running in this working tree")
    if owner.get("bisect") is not None and owner["bisect"] == _bisect_id(top):
        _, back = _end_bisect(top, None)
        print(f"leakgate bisect: a killed bisect was left under way: {back}", file=sys.stderr)
    shutil.rmtree(state, ignore_errors=True)


def _end_bisect(top: Path, home: str | None) -> tuple[bool, str]:
    """``git bisect reset``: whether HEAD is back where it was (``home``), and a line."""
    try:
        git_or_refuse("bisect", "reset", cwd=top)
    except BadInput as exc:
        return False, f"could not end git's bisect ({exc.problem}): end it with git bisect reset"
    here = head_text(top)
    if home is not None and here != home:
        return False, f"ended git's bisect, but HEAD is {here}, not {home}"
    return True, f"put back {here} and ended git's bisect"


def _bisect_id(top: Path) -> list[int] | None:
    """Which git bisect is under way (its start file's inode and time), None when none is."""
    try:
        found = git_path("BISECT_START", top).stat()
    except FileNotFoundError:
        return None
    return [found.st_ino, found.st_mtime_ns]


def _check_tree(top: Path, good: str, bad: str) -> None:
    """Refuse a working tree whose changes a checkout between GOOD and BAD would overwrite (git
    would stop there with only ``Aborting``), naming the file and what to do."""
    names = ("--name-only", "--no-renames")  # a file renamed is two: both could be overwritten
    touched = git_names("diff", *names, "HEAD", good, cwd=top)
    touched |= git_names("log", "-m", *names, "--format=", f"{good}..{bad}", cwd=top)
    untracked = git_names("ls-files", "--others", "--exclude-standard", cwd=top)
    for paths, what, todo in (
        (changed_files(top) & touched, "changed", "commit or stash your changes (git stash)"),
        (untracked & touched, "not tracked", "move or remove it"),
    ):
        if paths:
            first, *more = sorted(paths)
            also = f" (and {len(more)} more)" if more else ""
            raise BadInput(
                f"{first}{also}: {what}, and a checkout between GOOD and BAD would overwrite it: "
                f"{todo}, then run the bisect again"
            )


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _print(commit: str, holder: str | None, how: str, top: Path) -> int:
    subject = git_or_refuse("log", "-1", "--format=%h %s", commit, cwd=top)
    print(f"first bad commit: {commit} ({how})")
    print(f"  {subject}")
    print(f"  {holder}" if holder else "  no holder named for its growth")
    return 0


def _narrowed(
    given: str, command: Sequence[str], good: str, path: list[str]
) -> tuple[str, str, str | None]:
    """GOOD and BAD narrowed by what the history knows of the test on this machine's CPU: the
    newest commit that passed before the first that failed after it. The third item is the
    holder line (or "") when those two are next to each other: the first bad commit is known."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from harness._history.archive import HistoryPlace, open_history, scan

    test = next((a for a in command if "::" in a), None)
    if test is None:
        return good, path[-1], None
    here = HistoryPlace.here()
    history = open_history(given)
    where = (ds.field("cpu_model") == (here.cpu_model or "")) & (ds.field("cores") == here.cores)
    order = [good, *path]
    statuses: dict[str, set[str]] = {}
    holders: dict[str, str] = {}
    commits = pa.array(order, pa.string())
    for batch in scan(history, ("test", "commit", "status", "holder"), where):
        ours = pc.and_(
            pc.equal(batch.column("test").dictionary_decode(), test),
            pc.is_in(batch.column("commit").dictionary_decode(), value_set=commits),
        )
        for row in batch.filter(ours.fill_null(False)).to_pylist():  # this test's rows only
            statuses.setdefault(row["commit"], set()).add(row["status"])
            holders[row["commit"]] = row["holder"] or ""
    verdict = {c: next(iter(s)) for c, s in statuses.items() if len(s) == 1}
    fails = [i for i, c in enumerate(order) if verdict.get(c) == Status.FAIL]
    first_fail = fails[0] if fails else len(order) - 1
    passes = [i for i in range(first_fail) if verdict.get(order[i]) == Status.PASS]
    low = passes[-1] if passes else 0
    high = min((i for i in fails if i > low), default=len(order) - 1)
    known = holders.get(order[high], "") if high == low + 1 and high in fails else None
    return order[low], order[high], known

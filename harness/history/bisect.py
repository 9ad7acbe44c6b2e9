"""``leakgate bisect GOOD BAD -- pytest tests/test_x.py::test_y``: the first commit whose test
fails its memory verdict, by ``git bisect run``.

Each commit ``git bisect`` picks is judged by :func:`step` (``python -m harness bisect-step``):
the command runs with ``--memreport`` into a folder of its own, and the verdicts it wrote
decide: a FAIL marks the commit bad (exit 1), all PASS good (0), an ERROR or no verdict at all
skips it (125). What each step found (its status and top holder) is kept by commit, so the
first bad commit is printed with its holder line. Where a history holds runs of the test on
this machine's CPU on both sides, the range is narrowed to the commits between the newest one
that passed and the first failing one after it, and only those are run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from harness.core.errors import BadInput
from harness.core.fsio import write_atomic
from harness.core.git import git, git_or_refuse
from harness.verdict.model import Status

GOOD, BAD, SKIP = 0, 1, 125


def command_of(given: Sequence[str]) -> list[str]:
    """The test command as run: ``pytest`` as this Python's (whose plugin is leakgate's)."""
    if not given:
        raise BadInput("no test command: give it after --, e.g. -- pytest tests/test_x.py::test_y")
    if given[0] == "pytest":
        return [sys.executable, "-m", "pytest", *given[1:]]
    return list(given)


def step(command: Sequence[str], state: Path) -> int:
    """Run the test command at HEAD, keep what it found under ``state/<commit>.json``, and
    answer as ``git bisect run`` reads an exit code."""
    from harness.history.archive import history_summary
    from harness.results.artifacts import load_run_document, verdict_files

    reports = Path(tempfile.mkdtemp(prefix="leakgate-bisect-"))
    try:
        subprocess.run([*command_of(command), f"--memreport={reports}"], check=False)
        documents = []
        for path in verdict_files(reports):
            try:
                documents.append(load_run_document(path))
            except BadInput:
                continue
    finally:
        shutil.rmtree(reports, ignore_errors=True)
    statuses = [str(d.get("status")) for d in documents]
    failed = [d for d in documents if d.get("status") == Status.FAIL]
    status: str
    if failed:
        status, answer = Status.FAIL, BAD
    elif statuses and all(s == Status.PASS for s in statuses):
        status, answer = Status.PASS, GOOD
    else:
        status, answer = Status.ERROR if statuses else "NO VERDICT", SKIP
    holder = history_summary(failed[0])["holder"] if failed else None
    commit = git_or_refuse("rev-parse", "HEAD")
    write_atomic(state / f"{commit}.json", json.dumps({"status": status, "holder": holder}))
    return answer


def bisect(good: str, bad: str, command: Sequence[str], history: str | None = None) -> int:
    """Find and print the first bad commit between ``good`` and ``bad``; 0 when one is named,
    1 when git could not name one (every candidate skipped)."""
    command_of(command)
    if not git("rev-parse", "--is-inside-work-tree") == "true":
        raise BadInput("not inside a git work tree: bisect runs in the repository")
    if Path(git_or_refuse("rev-parse", "--git-path", "BISECT_START")).exists():
        raise BadInput("a git bisect is already under way: end it with git bisect reset")
    good, bad = _commit(good, "GOOD"), _commit(bad, "BAD")
    path = git_or_refuse("rev-list", "--ancestry-path", f"{good}..{bad}").split()[::-1]
    if not path:
        raise BadInput("GOOD is not an ancestor of BAD: nothing to bisect")
    if history is not None:
        good, bad, known = _narrowed(history, command, good, path)
        if known is not None:
            return _print(bad, known, "from the history")
    state = Path(tempfile.mkdtemp(prefix="leakgate-bisect-state-"))
    try:
        git_or_refuse("bisect", "start", bad, good)
        try:
            run = [sys.executable, "-m", "harness", "bisect-step", "--state", str(state), "--"]
            done = subprocess.run(
                ["git", "bisect", "run", *run, *command], capture_output=True, text=True
            )
            named = "is the first bad commit" in done.stdout
            first = git("rev-parse", "--verify", "--quiet", "refs/bisect/bad")
            record = state / f"{first}.json"
            if named and first and not record.exists():  # BAD itself, never run by git
                git_or_refuse("checkout", "--quiet", first)
                step(command, state)
        finally:
            git("bisect", "reset")
        tried = len(list(state.glob("*.json")))
        print(f"bisect: ran the test at {tried} of {len(path)} commits")
        if not named or first is None or not record.exists():
            print("bisect: no first bad commit could be named (the commits left were skipped)")
            return 1
        found = json.loads(record.read_text())
        if found["status"] != Status.FAIL:
            print(f"bisect: {bad[:12]} does not fail its memory verdict here ({found['status']})")
            return 1
        return _print(first, found.get("holder"), "run here")
    finally:
        shutil.rmtree(state, ignore_errors=True)


def _commit(given: str, what: str) -> str:
    found = git("rev-parse", "--verify", "--quiet", f"{given}^{{commit}}")
    if not found:
        raise BadInput(f"not a commit here: {given!r}", field=what)
    return found


def _print(commit: str, holder: str | None, how: str) -> int:
    subject = git_or_refuse("log", "-1", "--format=%h %s", commit)
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

    from harness.history.archive import HistoryPlace, open_history, scan

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

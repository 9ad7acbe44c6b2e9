"""Running ``git``: the one runner for the run header's commit, the history store's provenance
and the bisect driver. ``git`` missing, a command that fails or one that runs past
:data:`TIMEOUT` is None to :func:`git`, and a one-line :class:`BadInput` to :func:`git_or_refuse`
(git's own words for it, read by :func:`git_said`). A few questions asked the same way by
every caller: the paths a command lists, the files changed, HEAD in words, a commit's name.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from harness._core.errors import BadInput

TIMEOUT = 60
"""Seconds a git command may run (a checkout of a large tree included)."""

Where = str | os.PathLike[str] | None
"""The folder a git command runs in (None: the working directory)."""


def _run(args: tuple[str, ...], cwd: Where) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None


def git(*args: str, cwd: Where = None) -> str | None:
    """What ``git args`` printed, stripped, or None where it could not run or failed."""
    done = _run(args, cwd)
    return done.stdout.strip() if done is not None and done.returncode == 0 else None


def git_or_refuse(*args: str, cwd: Where = None) -> str:
    """What ``git args`` printed, stripped; a failure is a :class:`BadInput` with what git said
    (:func:`git_said`), e.g. ``git checkout: Your local changes to the following files would
    be overwritten by checkout: a.py``."""
    done = _run(args, cwd)
    if done is None:
        raise BadInput(f"git {args[0]}: git could not run")
    if done.returncode != 0:
        raise BadInput(f"git {args[0]}: {git_said(done.stderr)}")
    return done.stdout.strip()


def git_said(output: str) -> str:
    """Git's complaint in ``output``, on one line: its first ``error:`` or ``fatal:`` line (the
    last line when it has none) and the files git lists under it, indented by a tab."""
    lines = [line.rstrip() for line in output.splitlines() if line.strip()]
    if not lines:
        return "failed"
    errors = [i for i, line in enumerate(lines) if line.startswith(("error:", "fatal:"))]
    start = errors[0] if errors else len(lines) - 1
    said = lines[start].split(":", 1)[1].strip() if errors else lines[start]
    files = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        files.append(line.strip())
    return f"{said} {', '.join(files)}" if files else said


def git_names(*args: str, cwd: Where = None) -> set[str]:
    """The paths a ``git args`` that lists paths prints (``-z`` added, so any name is read
    whole); empty where git failed."""
    done = _run((args[0], "-z", *args[1:]), cwd)
    ok = done is not None and done.returncode == 0
    return {name for name in done.stdout.split("\0") if name} if done and ok else set()


def changed_files(cwd: Where = None) -> set[str]:
    """Files git tracks whose index or working copy differs from HEAD (staged or not; both
    names of a file renamed)."""
    staged = git_names("diff", "--name-only", "--no-renames", "--cached", "HEAD", cwd=cwd)
    return staged | git_names("diff", "--name-only", "--no-renames", "HEAD", cwd=cwd)


def head_text(cwd: Where = None) -> str:
    """HEAD in words: ``main at 1a2b3c4``, or ``1a2b3c4 (detached)``."""
    commit = git("rev-parse", "--short", "HEAD", cwd=cwd)
    branch = git("symbolic-ref", "--quiet", "--short", "HEAD", cwd=cwd)
    return f"{branch} at {commit}" if branch else f"{commit} (detached)"


def commit_of(given: str, what: str, cwd: Where = None) -> str:
    """The full name of the commit ``given`` names; a :class:`BadInput` about ``what`` (the
    argument it came from) where it names none."""
    found = git("rev-parse", "--verify", "--quiet", f"{given}^{{commit}}", cwd=cwd)
    if not found:
        raise BadInput(f"not a commit here: {given!r}", field=what)
    return found


def git_path(name: str, cwd: Where = None) -> Path:
    """Where ``name`` is in the git folder of the working tree at ``cwd`` (``BISECT_START``, or
    a tool's own files beside it)."""
    return Path(cwd or ".", git_or_refuse("rev-parse", "--git-path", name, cwd=cwd))


def work_tree_top(cwd: Where = None) -> Path:
    """The top folder of the working tree at ``cwd``; a :class:`BadInput` outside one."""
    top = git("rev-parse", "--show-toplevel", cwd=cwd)
    if not top:
        raise BadInput("not inside a git work tree: run it in the repository")
    return Path(top)

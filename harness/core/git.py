"""Running ``git``: the one runner for the run header's commit, the history store's provenance
and the bisect driver. ``git`` missing, a command that fails or one that runs past
:data:`TIMEOUT` is None to :func:`git`, and a one-line :class:`BadInput` to :func:`git_or_refuse`.
"""

from __future__ import annotations

import os
import subprocess

from harness.core.errors import BadInput

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
    """What ``git args`` printed, stripped; a failure is a :class:`BadInput` with git's last
    line (``git bisect: ...``)."""
    done = _run(args, cwd)
    if done is None:
        raise BadInput(f"git {args[0]}: git could not run")
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["failed"])[-1]
        raise BadInput(f"git {args[0]}: {said}")
    return done.stdout.strip()

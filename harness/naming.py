"""File names the harness makes: a test id as a safe file name, a rank's timeline name, and
the run and rank read back from one."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

_RANK_SUFFIX = re.compile(r"[._-]rank(\d+)$")


def safe_name(nodeid: str) -> str:
    """A file name for a test id: no separators or dots to climb with, unique by a hash."""
    readable = re.sub(r"[^A-Za-z0-9_-]+", "_", nodeid.replace(".py::", "__")).strip("_")
    return f"{readable[:80]}-{hashlib.sha1(nodeid.encode()).hexdigest()[:8]}"


def rank_timeline(path: str | os.PathLike[str], rank: int) -> Path:
    """``<stem>.rank<N><suffix>`` for ``path``; unchanged when its stem already names that rank
    (``run.rank1.jsonl``, ``run-rank1.jsonl``)."""
    path = Path(path)
    found = _RANK_SUFFIX.search(path.stem)
    if found is not None and int(found.group(1)) == rank:
        return path
    return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def run_name(path: str | os.PathLike[str]) -> tuple[str, int] | None:
    """``("run", 1)`` for ``.../run.rank1.jsonl``; None for a name without a rank."""
    stem = Path(path).stem
    found = re.fullmatch(r"(.+)\.rank(\d+)", stem)
    return (found.group(1), int(found.group(2))) if found else None

"""Checks on output paths given on a command line, so that a bad one is refused before any work
starts rather than failing when the first file is written."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["write_problem"]


def write_problem(path: Path, *, folder: bool = False) -> str | None:
    """Why ``path`` cannot be written as a file (a folder to write into, with ``folder``), or
    ``None`` when it can: its nearest existing part must be a folder this process may write."""
    if path.is_dir() and not folder:
        return "is a folder"
    if path.exists() and not path.is_dir() and folder:
        return "is not a folder"
    start = path if folder and path.is_dir() else path.parent
    existing = next((p for p in (start, *start.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        return f"{existing} is not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None

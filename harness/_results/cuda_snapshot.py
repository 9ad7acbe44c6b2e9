"""CUDA memory snapshots for PyTorch's viewer (https://pytorch.org/memory_viz).

While a test runs with ``--memreport-snapshot`` (or ``memleak(snapshot=True)``), the caching
allocator records every allocation and free with its Python stack
(``torch.cuda.memory._record_memory_history``), at most :data:`MAX_ENTRIES` of them, so a
snapshot stays bounded (tens of MB at most); torch puts the recording at a few microseconds per
allocation. The snapshot is taken when the test's call ends and written as
``<test>.snapshot.pickle`` only for a failing leak, OOM or teardown. Without CUDA nothing is
recorded.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from harness._attribution.sites import sites_recorded
from harness._core.fsio import write_atomic
from harness._verdict.model import Kind

if TYPE_CHECKING:
    from harness._verdict.model import Verdict

MAX_ENTRIES = 20_000
VIEWER = "https://pytorch.org/memory_viz"
SUFFIX = ".snapshot.pickle"
SNAPSHOT_KINDS = (Kind.LEAK, Kind.OOM, Kind.TEARDOWN)


def can_record() -> bool:
    """Whether snapshots can be recorded here: a CUDA device is visible."""
    return torch.cuda.is_available()


@contextlib.contextmanager
def record_history(max_entries: int = MAX_ENTRIES) -> Iterator[bool]:
    """Record the allocator's history inside the block; yields whether it records (False
    without CUDA). A recording of allocation sites that was on before is put back after."""
    if not can_record():
        yield False
        return
    was_on = sites_recorded()
    record = torch.cuda.memory._record_memory_history
    record("all", context="all", stacks="python", max_entries=max_entries)
    try:
        yield True
    finally:
        if was_on:
            record("state", context="state", stacks="python")
        else:
            record(None)


@contextlib.contextmanager
def during(asked: bool, keep: Callable[[dict[str, Any]], object]) -> Iterator[None]:
    """Record the allocator's history through the block when ``asked`` and CUDA is visible, and
    hand the snapshot taken as the block ends to ``keep``."""
    if not asked or not can_record():
        yield
        return
    with record_history():
        try:
            yield
        finally:
            keep(take())


def take() -> dict[str, Any]:
    """The allocator's state and recorded history now (what ``_dump_snapshot`` pickles)."""
    return torch.cuda.memory._snapshot()


def write(path: str | os.PathLike[str], snapshot: dict[str, Any]) -> Path:
    """Write a snapshot taken by :func:`take`, atomically, as the viewer reads it."""
    return write_atomic(path, pickle.dumps(snapshot))


def dump_snapshot(path: str | os.PathLike[str]) -> Path:
    """Take a snapshot now and write it to ``path``."""
    return write(path, take())


def link_snapshot(markdown: Path, snapshot: Path) -> None:
    """Add a section linking the snapshot to the report at ``markdown`` (rewritten atomically)."""
    text = markdown.read_text()
    text += (
        f"\n## Memory Snapshot\n\n[{snapshot.name}]({snapshot.name}): the CUDA allocator's "
        f"history during the test; drop it on {VIEWER} to see every allocation and its stack.\n"
    )
    write_atomic(markdown, text)


def keep(
    snapshot: dict[str, Any] | None, verdict: Verdict, files: Path | None, report: Path | None
) -> list[str]:
    """Write ``snapshot`` to ``<files>.snapshot.pickle`` and link it from ``report`` when the
    verdict failed for a leak, an OOM or a teardown residue; the lines a failure message adds.
    Without ``files`` (no report folder) nothing is written and a line says so. ``OSError``
    names a file that could not be written."""
    failed = any(f.kind in SNAPSHOT_KINDS and f.blocking for f in verdict.findings)
    if snapshot is None or not failed:
        return []
    if files is None:
        return ["  memory snapshot: not written (give --memreport to keep it)"]
    path = write(files.with_name(files.name + SUFFIX), snapshot)
    if report is not None and report.exists():
        link_snapshot(report, path)
    return [f"  memory snapshot: {path} (open it at {VIEWER})"]

"""A recording's timeline header: who recorded what, where, with which probe and settings."""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
import socket
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from harness._core.errors import BadArgument
from harness._core.version import __version__
from harness._measure.children import SCHEDULE, SUMS, ChildSampler
from harness._measure.host import HOST, READINGS, HostMemory
from harness._measure.probes import Probe
from harness._measure.sample import STRIDE

if TYPE_CHECKING:
    from harness._core.records import Header


def run_header(
    probe: Probe,
    children: ChildSampler | None,
    capacity: int | None,
    emulated: bool,
    config: Any,
    meta: Mapping[str, Any] | None,
    host: HostMemory | None = None,
) -> Header:
    """The header of a run that ``probe`` reads (with ``children`` when they are read, and the
    ``host`` beside a device when it is read):
    versions, the probe's facts and notes, the capacity, host, process, git commit,
    ``config`` (a mapping or a dataclass: ``TypeError`` otherwise) and ``meta``."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = dataclasses.asdict(config)
    if config is not None and not isinstance(config, Mapping):
        raise BadArgument(f"config: expected a mapping or a dataclass, got {config!r}")
    facts = probe.describe()
    header: Header = {
        "leakgate": __version__,
        "run_id": uuid.uuid4().hex,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "probe": probe.name,
        "primary": probe.primary,
        "metrics": [
            *probe.metrics,
            *(SUMS if children is not None else ()),
            *(HOST + m for m in (READINGS if host is not None else ())),
        ],
        "device": facts["device"],
        "total_memory": facts["total_memory"],
        "driver": facts["driver"],
        "capacity": capacity,
        "capacity_emulated": emulated,
        "capacity_metric": probe.capacity_metric,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.time(),
        "git_commit": _git_commit(),
        "config": dict(config) if config is not None else None,
        "meta": dict(meta) if meta is not None else {},
        "notes": [
            *probe.notes,
            *(children.notes if children else []),
            *(f"host {note}" for note in (host.notes if host else [])),
        ],
        "children": SCHEDULE if children is not None else None,
        "stride": {"metrics": list(probe.strided), **dataclasses.asdict(STRIDE)}
        if probe.strided
        else None,
    }
    if "cuda" in facts:
        header["cuda"] = facts["cuda"]
    return header


@functools.cache
def _git_commit() -> str | None:
    """HEAD of the git repository around the working directory, if there is one (git's
    runner loaded here, once: a recorder's import stays small)."""
    from harness._core.git import git

    return git("rev-parse", "HEAD") or None

"""How many ranks :func:`~harness._frontends.spawn.run_ranks` starts on this machine
(:func:`max_local_ranks`: its available memory at :data:`RANK_MEMORY` a rank, within the open
files and processes this process may have), and the check of a world size against it
(:func:`check_local_ranks`)."""

from __future__ import annotations

import os
import resource

from harness._core.errors import BadArgument
from harness._core.identity import check_world_size
from harness._core.units import format_size

RANK_MEMORY = 150 * 2**20
"""The memory a local rank holds of its own (its anonymous resident memory: torch imported, a
gloo group joined, a recorder open; measured at 147 MiB), which bounds the ranks a machine can
run by its available memory."""


def check_local_ranks(nproc: int) -> None:
    """``nproc`` a world size (:func:`~harness._core.identity.check_world_size`) this machine can
    run; :class:`~harness._core.errors.BadArgument` saying why not otherwise."""
    check_world_size(nproc)
    bound, why = _local_bound()
    if nproc > bound:
        raise BadArgument(
            f"nproc: {nproc} ranks is more than this machine can run: at most {bound} local "
            f"ranks ({why})"
        )


def max_local_ranks() -> int:
    """The most ranks :func:`~harness._frontends.spawn.run_ranks` starts on this machine: as
    many as its available memory holds at :data:`RANK_MEMORY` each, within the open files and
    processes this process may have (a rank holds a socket to every other)."""
    return _local_bound()[0]


def _local_bound() -> tuple[int, str]:
    """:func:`max_local_ranks` and why, in words."""
    available = _available_memory()
    said = f"{format_size(available)} of memory available at about {format_size(RANK_MEMORY)}"
    bounds = [(max(1, available // RANK_MEMORY), f"{said} a rank")]
    files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if files != resource.RLIM_INFINITY:
        bounds.append((max(1, files - 64), f"{files} open files allowed"))
    processes = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    if processes != resource.RLIM_INFINITY:
        bounds.append((max(1, processes // 16), f"{processes} processes and threads allowed"))
    return min(bounds)


def _available_memory() -> int:
    """``MemAvailable`` (Linux), else the free physical pages."""
    try:
        with open("/proc/meminfo", "rb") as meminfo:
            for line in meminfo:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))

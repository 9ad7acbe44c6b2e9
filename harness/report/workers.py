"""The DataLoader workers in a report: one column per worker role in the Memory Profile (its
resident anonymous memory, read at every checkpoint) and the Memory Analysis (its judged new
memory's growth), the workers' total for the chart, and how children were sampled."""

from __future__ import annotations

import re

import numpy as np

from harness.child_sampling import parse_processes
from harness.children import role_metric
from harness.markdown import Markdown, code, plain, text
from harness.report.run import Run
from harness.units import format_mib, format_size

MAX_ROLES = 8
"""Worker columns a table gets at most (the lowest roles, in order)."""
_WORKER = re.compile(r"(loader (\d+) )?worker (\d+)")


def worker_roles(run: Run) -> list[str]:
    """The worker roles the run's samples name, in loader and worker order."""
    c = run.columns
    roles = {
        role
        for code_ in np.unique(c.processes).tolist()
        for role in parse_processes(c.strings[code_])
        if _WORKER.fullmatch(role)
    }
    return sorted(roles, key=_order)[:MAX_ROLES]


def _order(role: str) -> tuple[int, int]:
    found = _WORKER.fullmatch(role)
    assert found is not None
    return int(found.group(2) or 1), int(found.group(3))


def anon_cells(run: Run, i: int, roles: list[str]) -> list[str]:
    """Each worker role's ``anon`` at position ``i``, ``-`` where it was not alive."""
    sample = run.samples[i]
    return [
        format_mib(v) if (v := sample.get(role_metric("child_anon", r))) else "-" for r in roles
    ]


def growth_cells(run: Run, scope: str, roles: list[str]) -> list[str]:
    """Each worker role's judged growth of new memory in ``scope``, ``-`` where not judged."""
    measured = {
        c.scope: c.measured
        for c in run.verdict.checks
        if c.rule == "max_child_growth" and c.measured is not None
    }
    cells = []
    for role in roles:
        value = measured.get(f"{scope}, {role}")
        cells.append("-" if value is None else format_size(value, signed=True))
    return cells


def workers_total(run: Run, roles: list[str]) -> np.ndarray:
    """The workers' ``anon`` summed at every checkpoint (NaN where none was alive)."""
    c = run.columns
    total = np.zeros(len(c.batch))
    alive = np.zeros(len(c.batch), dtype=bool)
    for role in roles:
        name = role_metric("child_anon", role)
        total += c.values(name)
        alive |= c.present(name)
    return np.where(alive, total, np.nan)


PROFILE_NOTE = Markdown(
    f"Worker columns: each worker role's {code('anon')} (resident anonymous memory, read at "
    "every checkpoint; `-` where the worker was not alive)."
)


def sampling_note(run: Run) -> Markdown:
    """How children were sampled (the timeline header's words), or that they were not."""
    schedule = run.header.get("children")
    if isinstance(schedule, str) and schedule:
        return Markdown(
            f"Child processes are sampled so: {plain(schedule, 400)}. A worker's growth is its "
            f"judged new memory: {code('child_metric')} plus the change in the pages it still "
            "shares, so pages copied from the parent are not counted."
        )
    return text("Child processes were not recorded (children=False, or an older timeline).")

"""The DataLoader workers in a report: one column per worker role in the Memory Profile (the
memory it is judged on: its live heap, else its anon) and the Memory Analysis (its judged
growth), the children's total for the chart, how children were sampled and which measure
judged each role."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from harness._core.markdown import Markdown, code, plain, text
from harness._core.units import format_mib, format_size
from harness._measure.children import parse_processes, role_metric
from harness._measure.worker_roles import Role
from harness._report.run import Run

MAX_ROLES = 8
"""Worker columns a table gets at most (the lowest roles, in order)."""


def worker_roles(run: Run) -> list[str]:
    """The worker roles the run's samples name, in loader and worker order."""
    c = run.columns
    roles = {
        role
        for code_ in np.unique(c.processes).tolist()
        for text_ in parse_processes(c.strings[code_])
        if (role := Role.read(text_)) is not None
    }
    return [role.text for role in sorted(roles)[:MAX_ROLES]]


def memory_cells(run: Run, i: int, roles: list[str]) -> list[str]:
    """Each worker role's judged memory at position ``i``: its latest live heap reading (a
    worker publishes one per batch it makes), else its ``anon``; ``-`` where it was not
    alive."""
    alive = parse_processes(run.samples[i].processes)
    cells = []
    for role in roles:
        value = None
        if role in alive:
            for metric in (role_metric("child_heap", role), role_metric("child_anon", role)):
                at = _latest(run, metric, i)
                if at is not None:
                    value = run.samples[at].get(metric)
                    break
        cells.append(format_mib(value) if value else "-")
    return cells


_READ: weakref.WeakKeyDictionary[Any, dict[str, np.ndarray]] = weakref.WeakKeyDictionary()
"""Each report's columns: the positions where each metric was read."""


def _latest(run: Run, metric: str, i: int) -> int | None:
    """The last position at or before ``i`` where ``metric`` was read."""
    read = _READ.setdefault(run.columns, {})
    at = read.get(metric)
    if at is None:
        at = read[metric] = np.flatnonzero(run.columns.present(metric))
    k = int(np.searchsorted(at, i, side="right"))
    return int(at[k - 1]) if k else None


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


def children_total(run: Run) -> np.ndarray | None:
    """The children's judged memory (``children_heap``; ``children_anon`` in older timelines)
    at every checkpoint, NaN where none was alive; None when none ever was."""
    c = run.columns
    name = "children_heap" if c.present("children_heap").any() else "children_anon"
    alive = c.present(name)
    return np.where(alive, c.values(name), np.nan) if alive.any() else None


PROFILE_NOTE = Markdown(
    "Worker columns: the memory each worker role is judged on, its live heap where the worker "
    f"publishes one, else its {code('anon')} (`-` where the worker was not alive)."
)


def measures(run: Run) -> dict[str, str]:
    """Each child role's measure (``live heap`` where it published one and the rules judge
    it, else ``anon``)."""
    c = run.columns
    inside = run.verdict.rules.child_metric == "heap"
    roles = {
        role
        for code_ in np.unique(c.processes).tolist()
        for role in parse_processes(c.strings[code_])
    }
    return {
        role: "live heap" if inside and c.present(role_metric("child_heap", role)).any() else "anon"
        for role in roles
    }


def budget_note(run: Run) -> Markdown:
    """The option a worker's growth is judged against, as written: ```max_growth` (4MB)``."""
    rules = run.verdict.rules
    name = rules.budget("max_child_growth") or "max_child_growth"
    return Markdown(f"{code(name)} ({text(rules.shown(name))})")


def sampling_note(run: Run) -> Markdown:
    """How children were sampled (the timeline header's words), or that they were not."""
    schedule = run.header.get("children")
    if isinstance(schedule, str) and schedule:
        judged = measures(run)
        said = "; ".join(f"{plain(role, 60)}: {m}" for role, m in sorted(judged.items()))
        return Markdown(
            f"Child processes are sampled so: {plain(schedule, 400)}. Each one is judged on its "
            "live heap where it publishes one, read inside it as the main process's is (what "
            "its allocator keeps after a free is not growth), else on its anon, read from "
            f"outside" + (f". Judged on: {said}." if said else ".")
        )
    return text("Child processes were not recorded (children=False, or an older timeline).")

"""Holders inside DataLoader workers: a worker whose own live heap grows past the budget names
what holds that growth on its own heap, as the main process names its own, and leaves the
answer in its board for the main process to report (``held in worker 0 by
MosaicDataset.buffer (list, 176 items, 7.7MiB)``).

:class:`WorkerSearch` is the hook :func:`harness._measure.heap_board.watch_batches` calls in a
worker after each reading it publishes. Counted by those readings (one a batch the worker makes):
past ``warmup`` of them, the first reading is its base; once the heap has grown
:data:`~harness._attribution.phase.CENSUS_FROM` past it, every object alive is noted (the
census); where it passes ``budget``, and again each time that growth doubles (at most
:data:`WORKER_SEARCHES` times a worker), its holders are picked as the main process picks them
(:func:`~harness._attribution.pick.pick`: the new tensors' holders, else what retains most of what
is new since the census) and written, whole, over ``<board>/<pid>.held``. :func:`held_in`
reads those files back in the main process.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace

import harness._measure.heap_board as heap_board
from harness._attribution.holder import Holder
from harness._attribution.holders import MAX_OBJECTS, attribute
from harness._attribution.phase import CENSUS_FROM
from harness._attribution.pick import pick
from harness._attribution.retained import retained_holders
from harness._attribution.snapshot import Snapshot, live_tensors
from harness._core.errors import LeakgateError
from harness._core.fsio import write_atomic
from harness._core.json_values import read_json
from harness._verdict.options import Rules

WORKER_SEARCHES = 3
"""Searches a worker may take: where its growth passes the budget, and two doublings."""
HELD_SUFFIX = ".held"


@dataclass
class WorkerSearch:
    """Names the holders of a worker's growth past ``budget`` bytes after ``warmup`` readings,
    into ``board`` (see the module's doc). Called as ``search(heap, count)``."""

    board: str
    budget: int
    warmup: int
    _base: int | None = field(default=None, init=False, repr=False)
    _census: Snapshot | None = field(default=None, init=False, repr=False)
    _named_at: int = field(default=0, init=False, repr=False)
    _searches: int = field(default=0, init=False, repr=False)

    def __call__(self, heap: int, count: int) -> None:
        if count <= self.warmup:
            return
        if self._base is None:
            self._base = heap
            return
        grown = heap - self._base
        if self._census is None:
            if grown >= CENSUS_FROM:
                self._census = live_tensors(objects=True)
            return
        if grown <= max(self.budget, 2 * self._named_at) or self._searches >= WORKER_SEARCHES:
            return
        self._named_at, self._searches = grown, self._searches + 1
        census = self._census
        found = pick(
            attribute(census, limit=None),
            grown,
            lambda: retained_holders(census, MAX_OBJECTS),
            cpp=False,
        )
        record = {"growth": grown, "count": count, "holders": [h.to_dict() for h in found]}
        path = os.path.join(self.board, f"{os.getpid()}{HELD_SUFFIX}")
        write_atomic(path, json.dumps(record).encode())

    def own_bytes(self) -> int:
        """What this search keeps in the worker (its census), which the worker's published
        heap leaves out."""
        return self._census.nbytes() if self._census is not None else 0

    def __getstate__(self) -> dict[str, object]:
        """What a spawned worker is given: the settings, none of this process's state."""
        return {"board": self.board, "budget": self.budget, "warmup": self.warmup}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(**state)  # type: ignore[misc]


def watch_workers(board: str, rules: Rules | None) -> bool:
    """Have the DataLoader workers that publish into ``board`` name what holds their own
    growth past the children's budget of ``rules``; whether they will (not without one)."""
    if rules is None:
        return False
    name = rules.budget("max_child_growth")
    limit = rules.size(name) if name is not None else None
    if limit is None:
        return False
    heap_board.watch_batches(WorkerSearch(board, limit, rules.warmup))
    return True


def held_in(board: str, roles: dict[int, str]) -> list[Holder]:
    """The holders each worker in ``roles`` (pid to role) named into ``board``, each with its
    role as ``process`` and the growth it was named at; none for a file that cannot be read."""
    found: list[Holder] = []
    for pid, role in roles.items():
        path = os.path.join(board, f"{pid}{HELD_SUFFIX}")
        if not os.path.isfile(path):
            continue
        try:
            record = read_json(path)
            growth = int(record["growth"])
            holders = [Holder.from_dict(h) for h in record["holders"]]
        except (LeakgateError, OSError, ValueError, KeyError, TypeError):
            continue
        found += [replace(h, process=role, growth=growth) for h in holders]
    return found

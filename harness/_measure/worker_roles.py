"""DataLoader workers' roles: ``worker <id>`` for each worker of an iterator, learned where
torch hands an iterator's worker pids, in id order, to its signal handling
(``_set_worker_pids``, called from the multi-process iterator's ``__init__``, which tells the
hook its loader's dataset): :data:`PID_HOOKS` wraps both while held (through
:data:`~harness._measure.patches.PATCHES`), at no cost per checkpoint, and they are put back
when its last holder lets go.

torch gives every worker the same process name (``pt_data_worker``, set once the worker runs;
``python`` before, under spawn) and keeps the id inside the worker, so the id is learned here.
When another iterator's workers are alive at the same time (a persistent training loader during
validation), the newer iterator's are ``loader <n> worker <id>``, ``n`` the lowest number free.
A new iterator over the same dataset as a live one takes its number: Lightning makes each
epoch's validation iterator before it drops the last one (the sanity check's, first), and its
workers stay ``worker <id>`` every epoch. Workers of an iterator made before the hook was
wrapped are named as any process (:mod:`harness._measure.children`).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness._measure.patches import Patch

_WORKER = re.compile(r"(?:loader (\d+) )?worker (\d+)")


@dataclass(frozen=True, order=True)
class Role:
    """A DataLoader worker's role: its iterator's number (1 for the first alive) and its id.
    A timeline keeps a role as :attr:`text` (in a sample's ``processes`` and its per-role
    metric names); :meth:`read` is the one reading of that text back."""

    loader: int
    worker: int

    @property
    def text(self) -> str:
        prefix = "" if self.loader == 1 else f"loader {self.loader} "
        return f"{prefix}worker {self.worker}"

    @classmethod
    def read(cls, text: str) -> Role | None:
        """The worker role ``text`` names; None for another child's (a command's name)."""
        found = _WORKER.fullmatch(text)
        return None if found is None else cls(int(found.group(1) or 1), int(found.group(2)))


class WorkerRoles:
    """DataLoader worker pids to roles, filled by torch's ``_set_worker_pids`` hook."""

    def __init__(self) -> None:
        self.roles: dict[int, str] = {}
        self._loaders: dict[int, tuple[int, tuple[int, ...], int | None]] = {}
        """Each registered iterator's number, worker pids and ``id`` of its dataset."""
        self.generation = 0
        """Moves each time an iterator's workers are named."""

    def add(self, key: int, pids: Sequence[int], dataset: int | None = None) -> None:
        """Name iterator ``key``'s workers. A new iterator over the ``dataset`` of a registered
        one (a loader's next epoch, made while its last epoch's iterator still lives) takes
        its number, and the older one's workers, about to exit, lose their roles."""
        older = next(
            (k for k, (_, _, of) in self._loaders.items() if dataset is not None and of == dataset),
            None,
        )
        if older is not None:
            number, old_pids, _ = self._loaders.pop(older)
            for pid in old_pids:
                self.roles.pop(pid, None)
        else:
            taken = {number for number, _, _ in self._loaders.values()}
            number = next(n for n in range(1, len(taken) + 2) if n not in taken)
        self.generation += 1
        self._loaders[key] = (number, tuple(pids), dataset)
        for worker_id, pid in enumerate(pids):
            self.roles[pid] = Role(number, worker_id).text

    def remove(self, key: int) -> None:
        """Free the iterator's number; its workers keep their roles while they exit."""
        self._loaders.pop(key, None)

    def clear(self) -> None:
        """Forget every iterator: unwatched, torch no longer says when one ends."""
        self._loaders.clear()
        self.roles.clear()
        self.generation += 1

    def forget(self, live: set[int]) -> None:
        """Drop the roles of workers that exited and whose iterator is gone (pids are reused)."""
        current = {pid for _, pids, _ in list(self._loaders.values()) for pid in pids}
        for pid in [pid for pid in list(self.roles) if pid not in live and pid not in current]:
            del self.roles[pid]


ROLES = WorkerRoles()


_made = threading.local()
"""The ``id`` of the dataset of the DataLoader whose iterator this thread is making, if any."""


def _making(init: Any) -> Any:
    """``init`` (a multi-process iterator's ``__init__(self, loader)``, which calls the pid
    hook) noting its loader's dataset for the hook while it runs."""

    def make(self: object, loader: object, *args: Any, **kwargs: Any) -> None:
        dataset = getattr(loader, "dataset", None)
        outer = getattr(_made, "dataset", None)
        _made.dataset = None if dataset is None else id(dataset)
        try:
            init(self, loader, *args, **kwargs)
        finally:
            _made.dataset = outer

    return make


class _PidHooks(Patch):
    """torch's ``_set_worker_pids`` and ``_remove_worker_pids`` hooks and its multi-process
    iterator's ``__init__``, wrapped to name workers into :data:`ROLES`; put back where ours
    are still in place (another tool's wrapper around ours stays, and calls ours)."""

    def __init__(self) -> None:
        self._originals: tuple[Any, ...] | None = None
        """torch's two hooks and its iterator's ``__init__``, and the wrappers put in their
        place."""

    def put(self) -> str | None:
        try:
            from torch.utils.data._utils import signal_handling
        except ImportError:
            return "DataLoader workers named by command: torch is not importable"
        set_pids = getattr(signal_handling, "_set_worker_pids", None)
        remove_pids = getattr(signal_handling, "_remove_worker_pids", None)
        if set_pids is None or remove_pids is None:
            return "DataLoader workers named by command: this torch has no _set_worker_pids"

        from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter as iterator

        def set_worker_pids(key: int, child_pids: tuple[int, ...]) -> None:
            ROLES.add(key, child_pids, getattr(_made, "dataset", None))
            set_pids(key, child_pids)

        def remove_worker_pids(loader_id: int) -> None:
            ROLES.remove(loader_id)
            remove_pids(loader_id)

        init = iterator.__dict__["__init__"]
        signal_handling._set_worker_pids = set_worker_pids
        signal_handling._remove_worker_pids = remove_worker_pids
        made = _making(init)
        iterator.__init__ = made  # type: ignore[method-assign]
        self._originals = (set_pids, remove_pids, set_worker_pids, remove_worker_pids, init, made)
        return None

    def take_back(self) -> None:
        originals, self._originals = self._originals, None
        if originals is None:
            return
        from torch.utils.data._utils import signal_handling
        from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter as iterator

        set_pids, remove_pids, ours_set, ours_remove, init, ours_init = originals
        if signal_handling._set_worker_pids is ours_set:
            signal_handling._set_worker_pids = set_pids
        if signal_handling._remove_worker_pids is ours_remove:
            signal_handling._remove_worker_pids = remove_pids
        if iterator.__dict__.get("__init__") is ours_init:
            iterator.__init__ = init  # type: ignore[method-assign]
        ROLES.clear()


PID_HOOKS = _PidHooks()
"""What names DataLoader workers: held through :data:`~harness._measure.patches.PATCHES` (a
children reader holds it while it reads)."""

"""Every change leakgate makes to torch and to the process, and their one owner.

A *patch* (:class:`Patch`) is one such change: torch's DataLoader worker loop
(:data:`harness._measure.heap_board.WORKERS`), its worker-pid hooks
(:data:`harness._measure.worker_roles.PID_HOOKS`), a worker's fetchers (in the worker, for its
loop), the ``gc.freeze()`` a recorder starts from (:data:`FREEZE`). :data:`PATCHES` puts a patch
when its first holder asks (:meth:`Patches.hold`: a recorder, a children reader) and takes it
back when its last holder lets go (:meth:`Hold.release`), in any order; a holder that fails
halfway through holding lets go of what it held. The at-fork handlers a patch registers stay
registered (the process cannot unregister them) but act only while it is held
(:meth:`Patches.held`).

A forked child inherits its parent's holds: its at-fork handlers act as the parent's did, and a
patch held in the child is put again for the child (a board of its own) and taken back when the
child's own last holder lets go.
"""

from __future__ import annotations

import contextlib
import gc
import os
from abc import ABC, abstractmethod
from collections.abc import Callable


class Patch(ABC):
    """One change to torch or the process: :meth:`put` makes it (and says why, when it cannot
    be made in full), :meth:`take_back` undoes it where it still stands."""

    @abstractmethod
    def put(self) -> str | None: ...

    @abstractmethod
    def take_back(self) -> None: ...


class Hold:
    """One holder's claim on some patches; :meth:`release` it once (again does nothing). A
    context manager: released on leaving."""

    def __init__(self, owner: Patches, patches: tuple[Patch, ...]) -> None:
        self._owner = owner
        self.patches = patches
        self.pid = os.getpid()
        self.notes: list[str] = []
        """Why the patches could not be made in full, one line each."""
        self._on_release: list[Callable[[], None]] = []
        self.released = False

    def on_release(self, undo: Callable[[], None]) -> None:
        """Have :meth:`release` call ``undo`` before it lets go of the patches."""
        self._on_release.append(undo)

    def release(self) -> None:
        self._owner._release(self)

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


class Patches:
    """The one owner of every patch: each put at its first holder and taken back after its last
    (its holders in this process: a forked child's own)."""

    def __init__(self) -> None:
        self._holders: dict[Patch, list[Hold]] = {}
        self._notes: dict[Patch, str | None] = {}
        self._live: list[Hold] = []

    def hold(self, *patches: Patch) -> Hold:
        """Hold ``patches``, putting each that no holder of this process holds yet; when one
        raises, those held so far are let go of before the error goes on."""
        hold = Hold(self, patches)
        self._live.append(hold)
        try:
            for patch in patches:
                holders = self._holders.setdefault(patch, [])
                if not any(h.pid == hold.pid for h in holders):
                    self._notes[patch] = patch.put()
                holders.append(hold)
                note = self._notes.get(patch)
                if note:
                    hold.notes.append(note)
        except BaseException:
            self._release(hold)
            raise
        return hold

    def held(self, patch: Patch) -> bool:
        """Whether any holder holds ``patch`` (in a forked child: its parent's, at the fork)."""
        return bool(self._holders.get(patch))

    def newest(self, patch: Patch) -> Hold | None:
        """The latest hold of ``patch`` made in this process and not yet released."""
        pid = os.getpid()
        return next((h for h in reversed(self._holders.get(patch, [])) if h.pid == pid), None)

    def holds(self) -> list[Hold]:
        """Every hold not yet released, oldest first."""
        return list(self._live)

    def _release(self, hold: Hold) -> None:
        """Let go of ``hold``: its own undoing first, then each of its patches, last first, the
        ones it was their last holder here taken back (each, even when one raises)."""
        if hold.released:
            return
        hold.released = True
        self._live.remove(hold)
        with contextlib.ExitStack() as steps:  # run last pushed first
            for patch in hold.patches:
                steps.callback(self._let_go, hold, patch)
            for undo in hold._on_release:
                steps.callback(undo)

    def _let_go(self, hold: Hold, patch: Patch) -> None:
        holders = self._holders.get(patch, [])
        last = False
        if hold in holders:  # else it raised as it was put
            holders.remove(hold)
            last = not any(h.pid == hold.pid for h in holders)
        if not holders:
            self._holders.pop(patch, None)
        if last:
            self._notes.pop(patch, None)
            patch.take_back()


class _Freeze(Patch):
    """``gc.freeze()``: what exists when the first recorder starts is left out of every
    collection (``collect=True`` then costs what the run allocated) and counts as old for the
    attribution. Only when nothing was frozen before: what a process froze itself is never
    changed, and stands for the recorder's start. Taken back by ``gc.unfreeze()``, unless the
    process ran ``gc.freeze()`` since (then all that is frozen is its own freeze): a list made
    after leakgate's freeze tells, frozen or not, read once when taken back (one pass over the
    objects not frozen, about 60 ns each)."""

    def __init__(self) -> None:
        self._since: list[object] | None = None  # made after leakgate's freeze

    def put(self) -> None:
        if gc.get_freeze_count() == 0:
            gc.freeze()
            self._since = []

    def take_back(self) -> None:
        since, self._since = self._since, None
        if since is not None and any(o is since for o in gc.get_objects()):
            gc.unfreeze()


FREEZE = _Freeze()
"""The ``gc.freeze()`` recorders start from."""
PATCHES = Patches()
"""The one owner of leakgate's patches in this process."""

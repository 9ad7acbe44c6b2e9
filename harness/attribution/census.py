"""What containers keep, for memory that is not a tensor's storage: numpy arrays kept in a
module's dict, logging handlers added to a logger's list, strings in a cache.

A :func:`census` walks the object graph from the named roots once and charges every object to
the nearest *collection* above it (a list, dict, set or deque that is not an object's attribute
namespace nor a module's globals): its size (``sys.getsizeof``, which counts an array's data,
a buffered file's buffer and a string's characters) goes to that collection's payload. Two
censuses of one run tell which collections grew in between, in bytes and in items
(:func:`grown`; a walk may charge an object shared by two collections to either, so payload
alone moves a little from one census to the next), named by their path from a root with what
they gained: ``myproj.metrics._PREDS (dict, 176 items, 41.7MiB;
+176 ndarray)``. Only collections holding at least :data:`FLOOR` are remembered, so a census
kept between two searches stays small; one that grew from less counts from zero (at most
:data:`FLOOR` too much). leakgate's own objects are neither walked nor charged.
"""

from __future__ import annotations

import collections
import gc
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.attribution.holders import Holder
from harness.attribution.walk import SKIP, Walk, namespace

FLOOR = 4 * 1024
"""A collection holding less than this is not remembered between two censuses."""
_TEXT_FLOOR = 512
"""Strings and bytes shorter than this are not charged (names and keys, not payloads)."""
_COLLECTIONS = (list, dict, set, collections.deque)
_TEXTS = (str, bytes, bytearray)
_SMALL = frozenset({int, float, bool, complex, type(None)})
_OURS = __name__.partition(".")[0]
_NAMED = 3


@dataclass(frozen=True)
class Entry:
    """One collection's census: its type, payload in bytes and length."""

    kind: str
    payload: int
    items: int


class _Census:
    """The walk's visitor: charges each object reached to its nearest collection."""

    def __init__(self, walk: Walk) -> None:
        self.module_dicts: Mapping[int, str] = walk.module_dicts
        self.parents = walk.parent
        self.home: dict[int, Any] = {}  # id(object) -> its nearest collection, or None
        self.payload: dict[int, int] = {}
        self.collections: dict[int, Any] = {}
        self.namespaces: set[int] = set()
        self.counted: set[int] = set()

    def __call__(self, obj: Any, parent: Any) -> bool:
        kind = type(obj)
        if kind in _SMALL or (kind in _TEXTS and len(obj) < _TEXT_FLOOR):
            return True
        module = kind.__dict__.get("__module__")
        if isinstance(module, str) and module.partition(".")[0] == _OURS:
            return False
        if self._is_collection(parent):
            home = parent
            if id(parent) not in self.collections:  # a root's collection, never visited
                self.collections[id(parent)] = parent
                self.payload[id(parent)] = self.payload.get(id(parent), 0) + _size(parent)
        else:
            home = self.home.get(id(parent))
        if id(obj) in self.counted:
            return True
        self.counted.add(id(obj))
        self.home[id(obj)] = home
        size = _size(obj)
        if self._is_collection(obj, parent):
            self.collections[id(obj)] = obj
            self.payload[id(obj)] = self.payload.get(id(obj), 0) + size
            if not gc.is_tracked(obj):  # holds only untracked items, which no walk reaches
                self.parents.setdefault(id(obj), parent)  # so that it can be named
                for item in gc.get_referents(obj):
                    self(item, obj)
        elif home is not None:
            self.payload[id(home)] = self.payload.get(id(home), 0) + size
        base = getattr(obj, "base", None) if kind.__name__ == "ndarray" else None
        if base is not None:  # a view: the array that owns the data is charged with it
            self(base, obj)
        return True

    def _is_collection(self, obj: Any, parent: Any = None) -> bool:
        if type(obj) not in _COLLECTIONS or id(obj) in self.module_dicts:
            return False
        if id(obj) in self.collections:
            return True
        if id(obj) in self.namespaces:
            return False
        # An object's attribute namespace belongs to the object, not to a collection.
        if parent is not None and namespace(parent) is obj:
            self.namespaces.add(id(obj))
            return False
        return True


@dataclass
class Census:
    """Collections and their payloads at one moment (ids of those holding at least
    :data:`FLOOR`), and, for the census just taken, the walk that can name them."""

    entries: dict[int, Entry]
    walk: Walk | None = None
    objects: dict[int, Any] | None = None

    def forget(self) -> None:
        """Drop the references the census took (kept only to name what :func:`grown` finds)."""
        if self.walk is not None:
            self.walk.clear()
        self.walk = self.objects = None

    def nbytes(self) -> int:
        """Memory this census keeps between searches."""
        return sys.getsizeof(self.entries) + len(self.entries) * 200


def census(max_objects: int) -> Census:
    """Walk the object graph once (at most ``max_objects`` objects) and note each collection's
    payload. The result keeps the walk and its collections until :meth:`Census.forget`."""
    walk = Walk(max_objects)
    visitor = _Census(walk)
    walk.visit = visitor
    for own in (visitor, visitor.__dict__, *visitor.__dict__.values()):
        walk.parent[id(own)] = SKIP
    walk.run(rooted=True)
    entries = {
        ident: Entry(type(visitor.collections[ident]).__name__, payload, _length(obj))
        for ident, payload in visitor.payload.items()
        if payload >= FLOOR and (obj := visitor.collections.get(ident)) is not None
    }
    objects = {ident: visitor.collections[ident] for ident in entries}
    visitor.collections.clear()
    visitor.home.clear()
    return Census(entries, walk, objects)


def grown(before: Census, now: Census, floor: int = FLOOR, limit: int = _NAMED) -> list[Holder]:
    """The collections that gained items and bytes from ``before`` to ``now`` (``now`` as just
    taken by :func:`census`), by ``floor`` bytes at least, largest growth first, at most
    ``limit``: named by their path from a root, with what they gained."""
    if now.walk is None or now.objects is None:
        return []
    growth = []
    for ident, entry in now.entries.items():
        old = before.entries.get(ident)
        if old is not None and old.kind != entry.kind:
            old = None  # another collection at a freed one's address
        gained = entry.payload - (old.payload if old else 0)
        added = entry.items - (old.items if old else 0)
        if gained >= floor and added > 0:
            growth.append((gained, added, ident, entry))
    growth.sort(key=lambda g: -g[0])
    holders = []
    for gained, added, ident, entry in growth[:limit]:
        obj = now.objects[ident]
        path = now.walk.path_of(obj) or f"<unnamed {entry.kind}>"
        item = _item_type(obj)
        note = f"+{added} {item}" if added > 0 and item else ""
        holders.append(Holder(path, entry.kind, entry.items, 0, gained, note=note))
    return holders


def _size(obj: Any) -> int:
    try:
        return sys.getsizeof(obj)
    except Exception:
        return 0


def _length(obj: Any) -> int:
    try:
        return len(obj)
    except TypeError:
        return 0


def _item_type(obj: Any, sample: int = 256) -> str | None:
    """The most common type among a collection's items (a dict's values)."""
    values = obj.values() if isinstance(obj, dict) else obj
    counts: collections.Counter[str] = collections.Counter()
    for i, value in enumerate(values):
        if i >= sample:
            break
        counts[type(value).__name__] += 1
    return counts.most_common(1)[0][0] if counts else None

"""What was alive before: a :class:`Snapshot` notes, by weak reference, the tensors alive at a
phase's start (and the CUDA blocks in use), so that an attribution later can tell the tensors a
phase created from those it found; :func:`storage_of` is the storage identity both sides
compare, so that views of one storage count once."""

from __future__ import annotations

import collections
import gc
import sys
import time
import types
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from harness._attribution.names import namespace
from harness._attribution.quiet import unobserved
from harness._attribution.sites import allocator_blocks
from harness._attribution.weights import size_of
from harness._measure.host import live_python

StorageKey = tuple[str, int | None, int]


NO_STORAGE = (Exception,)
"""What asking a tensor about itself may raise: one without memory of its own (sparse, meta, a
wrapper subclass) has no storage, an uninitialized parameter (a lazy module's) refuses every
question, and a subclass's ``__torch_function__`` may raise anything. Such a tensor is skipped."""


@dataclass(frozen=True, eq=False)
class Snapshot:
    """The tensors alive at ``time``, by weak reference, but for those ``gc.freeze()`` hid
    (which count as older than any snapshot). ``blocks``: the allocator's blocks in use, as
    ``(storage key, size)``, when CUDA was in use. ``storages``: the storages of those
    tensors, by weak reference, so that a tensor made later over one of them (a view, a
    reshape of a cached table) is not taken for new memory."""

    tensors: Mapping[int, weakref.ref[torch.Tensor]] = field(repr=False)
    blocks: frozenset[tuple[StorageKey, int]] = field(default=frozenset(), repr=False)
    time: float = 0.0
    storages: Mapping[int, StorageWeakRef] = field(default_factory=dict, repr=False)
    graphs: Mapping[int, int] = field(default_factory=dict, repr=False)
    objects: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    """The ids of the objects ``gc`` tracked then (those it hid after a freeze excepted),
    sorted: an array, whose bytes are all malloc's, so that a recorder can leave them out of
    its readings exactly."""
    sizes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    """The size of each of :attr:`objects` then (:func:`~harness._attribution.weights.size_of`):
    a buffer that grew in place since is told by its size."""
    lengths: Mapping[int, int] = field(default_factory=dict, repr=False)
    """The lengths of the lists, dicts and deques among them and in module globals."""
    storage_sizes: Mapping[int, int] = field(default_factory=dict, repr=False)
    """The bytes of each of :attr:`storages` then: a storage resized in place (``resize_``)
    is told by its size."""
    untracked: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.int64), repr=False)
    """The id and size of each object ``gc`` does not track (an array, a string) of
    :data:`UNTRACKED_FROM` bytes or more that those objects referred to, sorted by id: an
    array a leak made and put in an old object's attribute is told from the one there then."""
    python: int = field(default=0, repr=False)
    """What Python's allocator's blocks grew by while the snapshot was made and kept (its weak
    references and the Python ints in its tables), measured around it."""

    def __len__(self) -> int:
        return len(self.tensors)

    def regraphed(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor``, seen then, has had an in-place operation recorded on its graph
        since (``total += loss`` on a tensor that requires grad): what that graph saved since
        is new memory its old tensor keeps."""
        grad_fn = tensor.grad_fn
        return grad_fn is not None and self.graphs.get(id(tensor)) != id(grad_fn)

    def __contains__(self, tensor: object) -> bool:
        ref = self.tensors.get(id(tensor))
        return ref is not None and ref() is tensor

    def nbytes(self) -> int:
        """What the live heap holds for this snapshot: its arrays and its tables in ``malloc``
        (its ids of objects dominate; a table of a few hundred tensors is tens of KiB), and the
        small objects in them, as measured when it was made (:attr:`python`)."""
        held = self.objects.nbytes + self.sizes.nbytes + self.untracked.nbytes
        tables = (
            self.tensors,
            self.blocks,
            self.storages,
            self.graphs,
            self.lengths,
            self.storage_sizes,
        )
        return int(held) + sum(map(sys.getsizeof, tables)) + self.python

    def listed(self, ids: np.ndarray) -> np.ndarray:
        """Which of ``ids`` (int64) were among :attr:`objects`."""
        return _find(self.objects, ids)[1]

    def had(self, objects: list[object]) -> np.ndarray:
        """Which of the untracked ``objects`` were among :attr:`untracked` (by id and size: an
        id reused by an object of another size is another object)."""
        at, found = _find(self.untracked[:, 0], _ids(objects))
        return found & (self.untracked[at, 1] == _sizes(objects)) if len(at) else found

    def grown(self, objects: list[object]) -> np.ndarray:
        """How many bytes each of ``objects`` grew by in place since (0 for one not among
        :attr:`objects`, or smaller now)."""
        at, found = _find(self.objects, _ids(objects))
        if not len(at):
            return np.zeros(len(objects), np.int64)
        return np.where(found, np.maximum(_sizes(objects) - self.sizes[at], 0), 0)

    def alive_storages(self) -> set[int]:
        """The storages (:func:`storage_id`) noted then that are still alive."""
        return {key for key, ref in self.storages.items() if not ref.expired()}


@unobserved
def live_tensors(objects: bool = False) -> Snapshot:
    """Note every tensor alive now (those ``gc.freeze()`` hid excepted) and the CUDA blocks in
    use. Cheap under a :class:`~harness.Recorder`, which freezes what existed before it. With
    ``objects``, note every object ``gc`` lists and the lengths of collections too (what a
    search by retained size counts from: tens of milliseconds, for the module globals)."""
    before = live_python()
    tensors: dict[int, weakref.ref[torch.Tensor]] = {}
    storages: dict[int, StorageWeakRef] = {}
    graphs: dict[int, int] = {}
    tensor_types: dict[type, bool] = {}
    everything = gc.get_objects()
    ids = sizes = np.zeros(0, np.int64)
    counted: dict[int, int] = {}
    storage_sizes: dict[int, int] = {}
    untracked = np.zeros((0, 2), np.int64)
    if objects:
        ids = _ids(everything)
        order = np.argsort(ids)
        ids, sizes = ids[order], _sizes(everything)[order]
        counted = lengths(everything)
        untracked = untracked_referents(everything)
    for obj in everything:
        kind = type(obj)
        is_tensor = tensor_types.get(kind)
        if is_tensor is None:
            is_tensor = tensor_types[kind] = issubclass(kind, torch.Tensor)
        if is_tensor:
            try:
                tensors[id(obj)] = weakref.ref(obj)
                if obj.grad_fn is not None:
                    graphs[id(obj)] = id(obj.grad_fn)
                storage = obj.untyped_storage()
            except NO_STORAGE:
                continue
            if storage._cdata not in storages:
                storages[storage._cdata] = StorageWeakRef(storage)
                if objects:
                    storage_sizes[storage._cdata] = storage.nbytes()
    blocks = frozenset((key, size) for key, size, _ in allocator_blocks())
    del everything
    made = Snapshot(
        tensors,
        blocks,
        time.time(),
        storages,
        graphs,
        objects=ids,
        sizes=sizes,
        lengths=counted,
        storage_sizes=storage_sizes,
        untracked=untracked,
    )
    after = live_python()
    if before is not None and after is not None:
        object.__setattr__(made, "python", max(0, after - before))
    return made


def _find(keys: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each of ``ids`` is in the sorted ``keys``, and whether it is there (no positions
    where ``keys`` is empty)."""
    if not len(keys):
        return np.zeros(0, np.intp), np.zeros(len(ids), bool)
    at = np.minimum(np.searchsorted(keys, ids), len(keys) - 1)
    return at, np.asarray(keys[at] == ids)


def _ids(objects: list[object]) -> np.ndarray:
    return np.fromiter(map(id, objects), np.int64, len(objects))


def _sizes(objects: list[object]) -> np.ndarray:
    return np.fromiter(map(size_of, objects), np.int64, len(objects))


UNTRACKED_FROM = 256
"""Untracked objects lighter than this (names, keys, numbers) are neither noted nor weighed."""
_LIGHT = frozenset({int, float, bool, type(None), type})


def untracked_referents(young: list[object]) -> np.ndarray:
    """The id and size of each untracked object of :data:`UNTRACKED_FROM` bytes or more that
    ``young`` refer to, directly or through an untracked dict, sorted by id (see
    :attr:`Snapshot.untracked`)."""
    seen = {}
    referred = untracked(gc.get_referents(*young))
    spaces = [o for o in referred if type(o) is dict]  # an instance's, of untracked values
    for obj in [*referred, *untracked(gc.get_referents(*spaces))]:
        size = size_of(obj)
        if size >= UNTRACKED_FROM:
            seen[id(obj)] = size
    return np.array(sorted(seen.items()), np.int64).reshape(-1, 2)


def untracked(objects: list[object]) -> list[object]:
    """Those of ``objects`` that ``gc`` does not track and may weigh something."""
    return [o for o in objects if type(o) not in _LIGHT and not gc.is_tracked(o)]


def lengths(young: list[object]) -> dict[int, int]:
    """The length of each list, dict and deque among ``young`` and in module globals: what a
    later search counts as added to them (``gc`` does not list the arrays and strings a leak
    appends to an old collection)."""
    held = [*young, *(c for c, _ in module_collections())]
    return {id(c): len(c) for c in held if type(c) in ORDERED}  # type: ignore[arg-type]


def module_collections() -> list[tuple[object, object]]:
    """The lists, dicts and deques that module globals name, each with those globals (an
    empty dict, or one of arrays and numbers, is one ``gc`` does not track), and those that
    the attributes of the objects module globals name hold, each with that object: a
    library's registry (torch.fx's ``_loader.eval_cache``, a dict of the source of every
    module it traced) is made before the recorder freezes the heap, which ``gc`` then no
    longer lists."""
    found: list[tuple[object, object]] = []
    for module in list(sys.modules.values()):
        table = getattr(module, "__dict__", None) if type(module) is types.ModuleType else None
        if type(table) is not dict:
            continue
        for value in list(table.values()):
            kind = type(value)
            if kind in ORDERED:
                found.append((value, table))
            elif gc.is_tracked(value) and not issubclass(kind, _NOT_REGISTRIES):
                found += [(v, value) for v in _attributes(value) if type(v) in ORDERED]
    return found


def _attributes(obj: object) -> list[object]:
    """What ``obj`` refers to, the values of its ``__dict__`` in place of the dict."""
    referents = gc.get_referents(obj)
    for at, item in enumerate(referents):
        if type(item) is dict and namespace(obj) is item:
            return [*referents[:at], *item.values(), *referents[at + 1 :]]
    return referents


_NOT_REGISTRIES = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, dict)
"""What module globals name whose referents are no registry's state: classes, modules,
functions (and dicts, collections of their own)."""


ORDERED = (list, dict, collections.deque, collections.defaultdict, collections.OrderedDict)
"""Collections whose new items come last, and whose length is their own (never a user's)."""


def storage_of(tensor: torch.Tensor) -> tuple[StorageKey | None, int]:
    """``((device type, index, address), nbytes)`` of a tensor's storage; ``(None, 0)`` for
    tensors without memory of their own (meta, empty, sparse or wrapper subclasses)."""
    try:
        storage = tensor.untyped_storage()
        nbytes = storage.nbytes()
        address = storage.data_ptr()
    except NO_STORAGE:
        return None, 0
    if not nbytes or not address or tensor.device.type == "meta":
        return None, 0
    return (tensor.device.type, tensor.device.index, address), nbytes


def storage_id(tensor: torch.Tensor) -> int | None:
    """The identity of a tensor's storage (its C++ object), shared by its views."""
    try:
        return int(tensor.untyped_storage()._cdata)
    except NO_STORAGE:
        return None

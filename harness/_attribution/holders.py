"""Holders: :func:`attribute` takes the tensors alive now that a snapshot did not see, names
what keeps each one through a :class:`~harness._attribution.walk.Walk`, groups them by that
reference into :class:`Holder` s, counts each new storage once (their autograd graphs' saved
tensors included) and ranks the holders by bytes."""

from __future__ import annotations

import collections
import gc
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from harness._attribution.graph import Graphs
from harness._attribution.holder import Holder
from harness._attribution.lines import Lines
from harness._attribution.quiet import unobserved
from harness._attribution.sites import Block, allocator_blocks, site_of
from harness._attribution.snapshot import Snapshot, StorageKey, storage_id, storage_of
from harness._attribution.walk import SIZED, Walk, kind_of, length, namespace
from harness._core.errors import BadArgument
from harness._core.units import format_size

_MODULE_STORES = ("_modules", "_parameters", "_buffers")
_PARAMETER_COLLECTIONS = (torch.nn.ParameterList, torch.nn.ParameterDict)
_COLLECTIONS = (
    torch.nn.ModuleList,
    torch.nn.ModuleDict,
    torch.nn.Sequential,
    *_PARAMETER_COLLECTIONS,
)
_SITES_PER_HOLDER = 3
MAX_OBJECTS = 1_000_000
"""Default search budget, in objects visited: a test process with torch imported holds about
200,000, walked in about 0.6 s on one core."""


@unobserved
def attribute(
    before: Snapshot | None = None,
    *,
    limit: int | None = 5,
    max_depth: int = 8,
    max_objects: int = MAX_OBJECTS,
    lines: Lines | None = None,
) -> list[Holder]:
    """The ``limit`` largest holders of tensors alive now and not in ``before``, largest
    first. Holders of no new bytes are left out.

    Each new tensor is named by its nearest *named* reference, at most ``max_depth`` references
    up from it:

    - an object's attribute or a class attribute: ``ClassName.attr`` (``nn.Module`` parameters,
      buffers and submodules too: ``Linear.weight``); a submodule's attribute by the path from
      its top module's own named reference through ``_modules`` (``train:model.0.activations``),
      so that layers of one class stay apart;
    - a module global: ``module.name``;
    - a closure cell: ``function:name``, the function whose variable it is (the closure's
      enclosing function);
    - a local of a running frame or of a suspended generator: ``function:name``. A frame that
      only a traceback keeps is an ordinary object: what holds the traceback is named
      (``train:errors``, the list of stored exceptions).

    The object that reference points to is the *holder*. Tensors under one holder form one
    :class:`Holder`, described at the deepest container they all share (``Cache.items['attn']``,
    a list of 176 items, rather than 176 tuples of one batch each). Bytes count each storage
    once (views share their base's storage), for the holder that keeps the most alive (then
    the most tensors), and only storages that are new: a view of a parameter holds nothing new.

    A tensor's autograd graph counts with it: the tensors its ``grad_fn`` chain saved for
    backward (activations, held in C++ where ``gc`` never sees them) are unpacked and their new
    storages counted in ``graph_bytes``, which ``bytes`` includes and holders are ranked by. A
    saved tensor whose Python object survives only because the graph holds it is counted there,
    not as a holder of its own. The graph's C++ nodes count too
    (:data:`~harness._attribution.graph.NODE_BYTES` each): a loss kept after ``backward()``
    freed what its graph saved still keeps the graph.

    New means: not in ``before`` and made after the last ``gc.freeze()``, over a storage that
    no tensor of ``before`` had. Without ``before``, the freeze alone decides (a
    :class:`~harness.Recorder` freezes what exists when it starts), and the state of live
    modules and optimizers counts as old; with nothing frozen either, long-lived data (a data
    set, a cache meant to stay) ranks with the leak, by size.

    Objects that no named root reaches are walked from ``gc.get_objects`` too: a holder found
    that way (a garbage cycle while ``gc`` is disabled, or C code) is named by class and
    attribute with a note saying so; one without any name is ``<unnamed ...>``, and a tensor
    referenced from Python nowhere is ``<outside Python>``. The example inputs a
    ``torch.jit.trace`` result keeps in C++ count for whatever holds the result. ``max_objects``
    bounds the search by the number of objects visited (about 3 µs each), so its result does
    not depend on the machine's load: the tensors not reached within it are counted under
    ``<not searched>``, and those reached are still named. On CUDA, with allocation stacks
    recorded (:func:`~harness._attribution.sites.record_sites`), each holder carries the allocation
    sites of its storages, and new blocks no Python holder accounts for are grouped by site
    under ``<no Python holder>``. With ``lines`` (an open
    :class:`~harness._attribution.lines.Lines`, the dearer search) each holder carries the lines
    that allocated its storages on any device,
    and new storages still alive that no Python object holds are grouped by that line under
    ``<no Python holder>`` too.
    """
    if max_depth < 1:
        raise BadArgument(f"max_depth must be at least 1, got {max_depth}")
    collecting = gc.isenabled()
    gc.disable()
    walk = Walk(max_objects, _targets(before))
    try:
        walk.run()
        holders = _Grouping(walk, before, max_depth, collecting, lines).holders()
    finally:
        walk.clear()
        if collecting:
            gc.enable()
    holders.sort(key=lambda h: (-h.bytes, -h.tensors, h.path))
    return holders[:limit] if limit is not None else holders


def _targets(before: Snapshot | None) -> set[int] | None:
    """The ids of the tensors a snapshot's attribution names, so that the walk can stop once
    it has reached them all: made since the last ``gc.freeze()`` (which ``gc.get_objects``
    alone lists) and not in ``before``. None, walk everything, without both."""
    if before is None or not gc.get_freeze_count():
        return None
    return {
        id(o) for o in gc.get_objects() if issubclass(type(o), torch.Tensor) and o not in before
    }


# -- grouping and naming -------------------------------------------------------------------------


@dataclass
class _Group:
    name: str | None
    why: str
    chains: list[list[Any]] = field(default_factory=list)
    storages: dict[StorageKey, int] = field(default_factory=dict)
    graph: dict[StorageKey, int] = field(default_factory=dict)
    collection: Any = None

    @property
    def tensors(self) -> list[torch.Tensor]:
        return [chain[-1] for chain in self.chains]


_LOOSE = ("outside Python", "not searched")


class _Grouping:
    def __init__(
        self,
        walk: Walk,
        before: Snapshot | None,
        max_depth: int,
        gc_on: bool,
        lines: Lines | None = None,
    ) -> None:
        self.walk = walk
        self.lines = lines
        self.before = before
        self.max_depth = max_depth
        self.gc_on = gc_on
        self.graphs = Graphs(walk)
        kinds = walk.kinds
        unfrozen = {}
        for obj in gc.get_objects():
            kind = type(obj)
            if kind not in kinds:
                kinds[kind] = kind_of(kind)
            if kinds[kind] == "tensor":
                unfrozen[id(obj)] = obj
        candidates = {**walk.tensors, **unfrozen}
        self.new: list[torch.Tensor] = []
        old: list[torch.Tensor] = []
        # Without a snapshot, the last gc.freeze() (a recorder's start) stands for one.
        frozen_old = before is not None or gc.get_freeze_count() > 0
        for key, t in candidates.items():
            fresh = key in unfrozen or not frozen_old
            seen = before is not None and t in before and not before.regraphed(t)
            (self.new if fresh and not seen else old).append(t)
        self.old = {storage_of(t)[0] for t in old}
        if before is None:
            self.old |= _state_storages(walk.modules, walk.optimizers)
        else:
            alive = before.alive_storages()
            self.old |= {storage_of(t)[0] for t in self.new if storage_id(t) in alive}
        self.counted: set[StorageKey | None] = {None, *self.old}

    def holders(self) -> list[Holder]:
        groups: dict[tuple[str, object], _Group] = {}
        for tensor in self.new:
            chain, name, why = self.walk.up(tensor, self.max_depth)
            top: object = None if why in _LOOSE else id(chain[0])
            collection = (
                None if name is None else self._collection(self.walk.parent.get(id(chain[0])))
            )
            if collection is not None:
                top, name = id(collection), self.walk.module_path(collection)
            elif name is not None and top is not None and self._alike(chain[0], name):
                top = name
            group = groups.setdefault((why, top), _Group(name, why, collection=collection))
            group.chains.append(chain)
        self._absorb_newest(groups)
        self._join_siblings(groups)
        for group in groups.values():
            for tensor in group.tensors:
                key, nbytes = storage_of(tensor)
                if key is not None and key not in self.counted:
                    group.storages[key] = nbytes
        held = [g for g in groups.values() if g.why not in _LOOSE]
        loose = sorted(
            (g for g in groups.values() if g.why in _LOOSE), key=lambda g: -sum(g.storages.values())
        )
        for group in held:
            reached = self.graphs.reach(group.tensors)
            group.graph = {k: v for k, v in reached.items() if k not in self.counted}
        # A storage counts once, for the holder that keeps the most alive (its tensors and
        # what their graphs saved), so a list of losses gets the activations of every step
        # rather than leaving the last one to a loop variable that also reaches it.
        held.sort(key=lambda g: (-sum({**g.graph, **g.storages}.values()), -len(g.chains)))
        for group in held:
            self._count(group)
            group.graph = {k: v for k, v in group.graph.items() if k not in self.counted}
            self.counted.update(group.graph)
        for group in loose:
            self._count(group)
        blocks = allocator_blocks()
        sites = {key: site_of(frames) for key, _, frames in blocks}
        holders = [self._holder(g, sites) for g in (*held, *loose)]
        holders += self._unheld(blocks)
        holders += self._unheld_lines({key[0] for key, _, _ in blocks})
        self.graphs.clear()
        return [h for h in holders if h.bytes > 0]

    def _collection(self, owner: Any) -> torch.nn.Module | None:
        """The nearest module container (``ModuleList``, ``ModuleDict``, ``Sequential``, a
        parameter list or dict) above the module whose parameter or buffer dict ``owner`` is:
        the layers a loop adds to a container are one holder, the container."""
        store = owner
        if not issubclass(type(store), dict):
            return None
        for _ in range(2):  # a module's parameter dict, reached through the module's __dict__
            owner = self.walk.parent.get(id(owner))
            if issubclass(type(owner), torch.nn.Module):
                break
        space = namespace(owner) if issubclass(type(owner), torch.nn.Module) else None
        if space is None or not any(space.get(n) is store for n in ("_parameters", "_buffers")):
            return None
        self.walk.module_name(owner)  # learns the module tree
        node, seen = owner, {id(owner)}
        while id(node) in self.walk.module_parents:
            node, _ = self.walk.module_parents[id(node)]
            if id(node) in seen:
                return None
            seen.add(id(node))
            if issubclass(type(node), _COLLECTIONS):
                return node
        return owner if issubclass(type(owner), _PARAMETER_COLLECTIONS) else None

    def _absorb_newest(self, groups: dict[tuple[str, object], _Group]) -> None:
        """A tensor a loop variable names (``loss``) that a container another group describes
        also keeps (``val_losses``) is that container's newest item: it joins that group, so the
        container is named with all its items rather than its newest one apart."""
        containers: dict[int, tuple[_Group, int]] = {}
        for group in groups.values():
            if group.why in _LOOSE or len(group.chains) < 2:
                continue
            depth = _shared_depth(group.chains)
            if issubclass(type(group.chains[0][depth]), SIZED):
                containers[id(group.chains[0][depth])] = (group, depth)
        if not containers:
            return
        for key, group in list(groups.items()):
            if group.why in _LOOSE or len(group.chains) != 1 or len(group.chains[0]) != 1:
                continue
            tensor = group.chains[0][0]
            for referrer in gc.get_referrers(tensor):
                found = containers.get(id(referrer))
                if found is not None and found[0] is not group:
                    owner, depth = found
                    owner.chains.append([*owner.chains[0][: depth + 1], tensor])
                    del groups[key]
                    break

    def _join_siblings(self, groups: dict[tuple[str, object], _Group]) -> None:
        """Groups whose owners are items of one list or dict (hooks piled in a module's
        ``_forward_hooks``, model copies kept in a list, a registry) become one group named by
        that container: what a loop adds to it is named as the container, not item by item."""
        by_container: dict[int, list[tuple[tuple[str, object], _Group]]] = {}
        containers: dict[int, Any] = {}
        for key, group in groups.items():
            if group.why in _LOOSE or group.name is None:
                continue
            owner = group.collection
            if owner is None:
                owner = self.walk.parent.get(id(group.chains[0][0]))
                host = self.walk.parent.get(id(owner))
                if issubclass(type(owner), dict) and namespace(host) is owner:
                    owner = host
            container = self.walk.parent.get(id(owner))
            if (
                issubclass(type(container), (list, dict, collections.deque))
                and not issubclass(type(owner), SIZED)
                and not self._module_store(container)
            ):
                by_container.setdefault(id(container), []).append((key, group))
                containers[id(container)] = container
        for ident, members in by_container.items():
            if len(members) < 2:
                continue
            container = containers[ident]
            name = self.walk.path_of(container)
            if name is None:
                continue
            joined = _Group(name, "", collection=container)
            for key, group in members:
                joined.chains += group.chains
                del groups[key]
            groups[("", ident)] = joined

    def _module_store(self, container: Any) -> bool:
        """Whether ``container`` is a module's submodules, parameters or buffers: layers of
        one model stay apart, each named by its path."""
        module = self.walk.parent.get(id(container))
        if issubclass(type(module), dict):
            module = self.walk.parent.get(id(module))
        space = namespace(module) if issubclass(type(module), torch.nn.Module) else None
        return space is not None and any(space.get(s) is container for s in _MODULE_STORES)

    def _alike(self, top: Any, name: str) -> bool:
        """Whether holders of one name are one holder however many objects bear it: garbage
        cycles (``Node.value`` of each unreachable node) and locals of frames that tracebacks
        keep (``step:out`` of each stored exception)."""
        if not self.walk.rooted(top):
            return True
        frame = self.walk.parent.get(id(top))
        return type(frame) is types.FrameType and frame.f_code.co_name in name

    def _owner_type(self, top: Any) -> str:
        """The type name of what holds ``top`` (``Node``, ``frame``)."""
        owner = self.walk.parent.get(id(top))
        if issubclass(type(owner), dict):
            owner = self.walk.parent.get(id(owner))
        if owner is None or type(owner) is object:
            owner = top
        return type(owner).__name__

    def _count(self, group: _Group) -> None:
        """Keep the storages of ``group`` that no group counted before."""
        group.storages = {k: v for k, v in group.storages.items() if k not in self.counted}
        self.counted.update(group.storages)

    def _note(self, group: _Group) -> str:
        """What a person should know about ``group``'s answer, or nothing."""
        notes = []
        if group.why == "not searched":
            budget = (
                f"{format_size(self.walk.max_bytes)} of its own memory"
                if self.walk.full
                else f"{self.walk.budget:,} objects (max_objects)"
            )
            notes.append(
                f"{len(group.chains)} tensors the search did not reach within its budget of "
                + budget
            )
        elif group.why not in _LOOSE and not self.walk.rooted(group.chains[0][0]):
            notes.append(
                "kept only by a reference cycle, or by C code"
                + ("; gc is disabled" if not self.gc_on else "")
            )
        library = {
            self.walk.library[id(o)] for c in group.chains for o in c if id(o) in self.walk.library
        }
        notes += sorted(library)
        if group.graph and self.graphs.cut:
            notes.append("graph counted in part (max_objects)")
        return "; ".join(notes)

    def _holder(self, group: _Group, sites: Mapping[StorageKey, str | None]) -> Holder:
        """Describe ``group`` at the deepest object all its chains share (a tensor's container
        when the group is one tensor below its holder)."""
        chains = group.chains
        first = chains[0]
        depth = _shared_depth(chains)
        if 0 < depth == len(first) - 1:
            depth -= 1
        labels = "".join(self.walk.edge(first[i], first[i + 1])[0] for i in range(depth))
        shared = first[depth]
        tops = {id(c[0]) for c in chains}
        if group.why in _LOOSE:
            path, kind, items = f"<{group.why}>", "tensors", len(chains)
        elif group.collection is not None:
            path = group.name or f"<unnamed {type(group.collection).__name__}>"
            kind, items = type(group.collection).__name__, len(group.collection)
        elif len(tops) > 1:
            path = group.name or f"<unnamed {type(first[0]).__name__}>"
            kind, items = f"{self._owner_type(first[0])} objects", len(tops)
        else:
            path = (group.name or f"<unnamed {type(first[0]).__name__}>") + labels
            if issubclass(type(shared), torch.Tensor):
                kind, items = "tensor", 1
            else:
                kind = type(shared).__name__
                sized = length(shared)
                items = len(chains) if sized is None else sized
        by_site: collections.Counter[str] = collections.Counter()
        for key, nbytes in (*group.storages.items(), *group.graph.items()):
            site = sites.get(key)
            if site is None and self.lines is not None:
                site = self.lines.line(key)
            if site is not None:
                by_site[site] += nbytes
        graph_bytes = sum(group.graph.values())
        top_sites = tuple(site for site, _ in by_site.most_common(_SITES_PER_HOLDER))
        note = self._note(group)
        if self.lines is not None and top_sites:
            note = "; ".join(filter(None, (note, f"allocated at {', '.join(top_sites[:2])}")))
        return Holder(
            path=path,
            container=kind,
            items=items,
            tensors=len(chains),
            bytes=sum(group.storages.values()) + graph_bytes,
            graph_bytes=graph_bytes,
            sites=top_sites,
            note=note,
        )

    def _unheld(self, blocks: list[Block]) -> list[Holder]:
        """New allocator blocks that no holder's storage accounts for, grouped by allocation
        site."""
        if self.before is None or not blocks:
            return []
        by_site: dict[str | None, list[int]] = {}
        for key, size, frames in blocks:
            if (key, size) in self.before.blocks or key in self.counted:
                continue
            by_site.setdefault(site_of(frames), []).append(size)
        return [
            Holder(
                f"<no Python holder> {site}" if site else "<no Python holder>",
                "blocks",
                len(sizes),
                0,
                sum(sizes),
                sites=(site,) if site else (),
            )
            for site, sizes in by_site.items()
        ]

    def _unheld_lines(self, sited: set[str]) -> list[Holder]:
        """New storages still alive that no holder counted, by the line that allocated them
        (those on a device in ``sited``, whose allocator gave blocks, left to :meth:`_unheld`)."""
        if self.lines is None:
            return []
        old = set(self.before.storages) if self.before is not None else set()
        since = self.before.time if self.before is not None else 0.0
        counted = self.counted
        if sited:
            counted = counted | {k for k in self.lines.storages if k[0] in sited}
        return [
            Holder(
                f"<no Python holder> {line}",
                "storages",
                len(sizes),
                0,
                sum(sizes),
                sites=(line,),
                note="allocated there; only C++ (an autograd graph, a library) keeps it",
            )
            for line, sizes in self.lines.unheld(counted, old, since).items()
        ]


def _shared_depth(chains: list[list[Any]]) -> int:
    """How deep the chains (each from its holder down to a tensor) run through the same
    objects: the index of the deepest object they all share."""
    first, depth = chains[0], 0
    shortest = min(len(c) for c in chains)
    while depth + 1 < shortest and all(c[depth + 1] is first[depth + 1] for c in chains):
        depth += 1
    return depth


def _state_storages(
    modules: Iterable[torch.nn.Module], optimizers: Iterable[torch.optim.Optimizer]
) -> set[StorageKey | None]:
    """Storages of live modules' parameters, buffers and gradients, and optimizer state."""
    tensors: list[torch.Tensor] = []
    for module in modules:
        for store in ("_parameters", "_buffers"):
            tensors += [t for t in module.__dict__.get(store, {}).values() if t is not None]
    tensors += [t.grad for t in tensors if t.grad is not None]
    for optimizer in optimizers:
        for state in optimizer.state.values():
            tensors += [v for v in state.values() if issubclass(type(v), torch.Tensor)]
    return {storage_of(t)[0] for t in tensors}

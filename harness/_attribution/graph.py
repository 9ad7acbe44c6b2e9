"""Autograd graphs: a tensor with a ``grad_fn`` keeps the tensors its graph saved for backward
(activations, held in C++ where ``gc`` never sees them). :class:`Graphs` walks
``grad_fn.next_functions`` from a holder's tensors and unpacks each node's ``_saved_*`` tensors
(and a custom function's ``saved_tensors``) where they are still readable, giving the storages
that holder keeps alive through its graphs, and each node itself, weighed at :data:`NODE_BYTES`
(what a kept loss still keeps after ``backward()`` freed its saved tensors). Each node counts
toward the search budget."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from harness._attribution.snapshot import StorageKey, storage_of
from harness._attribution.walk import Walk

_SAVED_NAMES: dict[type, tuple[str, ...]] = {}
NODE_BYTES = 750
"""What one autograd node keeps once a backward pass freed its saved tensors: 720 B on a stack
of Linear and ReLU layers, 787 B on Conv1d, GELU and LayerNorm (allocated growth over the nodes
of 300 kept graphs, torch 2.13 on CPU)."""


class Graphs:
    """The graphs reachable from tensors, each node unpacked once per attribution."""

    def __init__(self, walk: Walk) -> None:
        self.walk = walk
        self.cut = False
        self._nodes: dict[int, Any] = {}  # keeps every node seen alive, so ids stay unique
        self._saved: dict[int, list[tuple[StorageKey, int]]] = {}

    def reach(self, tensors: Iterable[torch.Tensor]) -> dict[StorageKey, int]:
        """The storages saved by the graphs of ``tensors``, with their sizes; what the budget
        left unwalked is missing, and :attr:`cut` says so."""
        found: dict[StorageKey, int] = {}
        stack: list[Any] = [t.grad_fn for t in tensors if t.grad_fn is not None]
        seen: set[int] = set()
        while stack:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            if self.walk.visited >= self.walk.budget:
                self.cut = True
                break
            self.walk.visited += 1
            seen.add(id(node))
            saved = self._saved.get(id(node))
            if saved is None:
                self._nodes[id(node)] = node
                saved = self._saved[id(node)] = _kept(node)
            found.update(saved)
            stack.extend(following for following, _ in node.next_functions)
        return found

    def clear(self) -> None:
        """Let go of the nodes."""
        self._nodes.clear()
        self._saved.clear()


def _kept(node: Any) -> list[tuple[StorageKey, int]]:
    """What ``node`` keeps: the storages it saved for backward (none once a backward pass
    freed them) and itself (:func:`node_bytes`, under a key of its own)."""
    kept = [
        (key, nbytes) for key, nbytes in map(storage_of, saved_tensors(node)) if key is not None
    ]
    own = node_bytes(node)
    if own:
        kept.append((("graph", None, id(node)), own))
    return kept


def node_bytes(node: Any) -> int:
    """What an autograd node itself keeps once a backward pass freed what it saved:
    :data:`NODE_BYTES`, or nothing for a parameter's gradient accumulator, which lives as long
    as the parameter."""
    return 0 if type(node).__name__ == "AccumulateGrad" else NODE_BYTES


def saved_tensors(node: Any) -> Iterator[torch.Tensor]:
    """The tensors an autograd node saved for backward, unpacked (none once freed)."""
    names = _SAVED_NAMES.get(type(node))
    if names is None:
        names = tuple(n for n in dir(type(node)) if n.startswith("_saved_") or n == "saved_tensors")
        _SAVED_NAMES[type(node)] = names
    for name in names:
        try:
            value = getattr(node, name)
        except (RuntimeError, AttributeError):
            continue
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, torch.Tensor):
                yield item

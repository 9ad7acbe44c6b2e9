"""What a search or a worker's hook meets that raises is either never asked (a search runs none
of an object's own code, so an object that refuses every question is named as any other) or
said: a DataLoader worker's hook that raises is dropped, and its worker says which and why."""

from __future__ import annotations

import os
from typing import Any, ClassVar

import pytest
import torch
from torch.utils.data import DataLoader

from harness._attribution import names
from harness._attribution.holders import attribute
from harness._attribution.retained import retained_holders
from harness._attribution.snapshot import live_tensors
from harness._attribution.weights import allotted, size_of
from harness._measure import heap_board, malloc
from harness._measure.patches import PATCHES

pytestmark = pytest.mark.usefixtures("heap_frozen")
ITEM = 2**18
"""Floats in each kept tensor (1 MiB): the search's largest holder by far."""


class Plain:
    """An ordinary object: what every other one here is named like."""


class Refuses:
    """An object that answers no question about itself."""

    def __getattribute__(self, name: str) -> Any:
        raise RuntimeError(f"refused: {name}")


class Classless:
    """An object that raises when asked its class (``isinstance`` asks)."""

    @property  # type: ignore[misc]
    def __class__(self) -> Any:
        raise RuntimeError("no class")


class DictProperty:
    """An object whose ``__dict__`` is a property of its own, which notes each call and
    raises."""

    calls: ClassVar[list[str]] = []

    @property  # type: ignore[misc]
    def __dict__(self) -> Any:
        DictProperty.calls.append("__dict__")
        raise RuntimeError("no dict")


class Registry(dict):
    """A dict whose own ``items``, iteration and length raise."""

    def items(self) -> Any:
        raise RuntimeError("no items")

    def __iter__(self) -> Any:
        raise RuntimeError("no iteration")

    def __len__(self) -> int:
        raise RuntimeError("no length")


class Unsized(list):
    """A list whose own iteration and length raise."""

    def __iter__(self) -> Any:
        raise RuntimeError("no iteration")

    def __len__(self) -> int:
        raise RuntimeError("no length")


def _holders(before: Any) -> list[list[str]]:
    """The first holder each search names, by tensors and by retained size."""
    found = [attribute(before), retained_holders(before, 200_000)]
    return [[f"{h.path} ({h.container}, {h.items})" for h in each[:1]] for each in found]


@pytest.mark.parametrize("kind", [Plain, Refuses, Classless])
def test_an_object_that_refuses_questions_is_named_by_its_attribute(kind):
    before = live_tensors(objects=True)
    holder = kind()
    object.__setattr__(holder, "items", [torch.ones(ITEM) for _ in range(8)])
    assert _holders(before) == [[f"{kind.__name__}.items (list, 8)"]] * 2
    del holder


@pytest.mark.parametrize("kind", [Plain, Refuses, Classless])
def test_a_list_of_objects_that_refuse_questions_is_named_by_its_variable(kind):
    before = live_tensors(objects=True)
    kept = []
    for _ in range(8):
        item = kind()
        object.__setattr__(item, "payload", torch.ones(ITEM))
        kept.append(item)
    del item
    assert _holders(before)[0] == [
        "test_a_list_of_objects_that_refuse_questions_is_named_by_its_variable:kept (list, 8)"
    ]
    del kept


@pytest.mark.parametrize("kind", [dict, Registry, list, Unsized])
def test_a_container_whose_items_and_length_raise_is_named_with_its_items(kind):
    before = live_tensors(objects=True)
    tensors = [torch.ones(ITEM) for _ in range(8)]
    kept = kind()
    if issubclass(kind, dict):
        dict.update(kept, enumerate(tensors))
    else:
        list.extend(kept, tensors)
    del tensors
    name = "test_a_container_whose_items_and_length_raise_is_named_with_its_items:kept"
    assert _holders(before) == [[f"{name} ({kind.__name__}, 8)"]] * 2
    del kept


def test_a_namespace_is_read_without_an_objects_own_code():
    holder = DictProperty()
    holder.value = 1  # kept in its instance dict, which the property hides
    assert names.namespace(holder) is None and DictProperty.calls == []
    assert names.namespace(Plain()) == {}
    assert names.namespace(Plain)["__doc__"] == Plain.__doc__  # a class's, through its type


def test_a_script_module_never_initialized_is_walked_past():
    """torch raises for its ``_c`` (no C++ module): the search names what else is kept."""
    script = torch.jit.RecursiveScriptModule.__new__(torch.jit.RecursiveScriptModule)
    before = live_tensors(objects=True)
    kept = [torch.ones(ITEM) for _ in range(8)]
    assert _holders(before)[0] == [
        "test_a_script_module_never_initialized_is_walked_past:kept (list, 8)"
    ]
    del script, kept


@pytest.mark.parametrize("kind", [Refuses, Classless, DictProperty])
def test_an_object_that_refuses_questions_weighs_as_a_plain_one(kind):
    weighed, plain = size_of(kind()), size_of(Plain())  # ints: never the objects' repr
    assert weighed == plain >= allotted(object.__sizeof__(Plain()))


def _failing_hook(heap: int, count: int) -> None:
    raise ValueError("no search here")


@pytest.mark.skipif(malloc.live_heap() is None, reason="needs glibc's mallinfo2")
def test_a_workers_hook_that_raises_is_dropped_and_said(capfd):
    with PATCHES.hold(heap_board.WORKERS):
        heap_board.watch_batches(_failing_hook)
        loader = DataLoader(
            list(range(6)), batch_size=None, num_workers=1, multiprocessing_context="fork"
        )
        assert list(loader) == list(range(6))  # the worker went on without its hook
    said = [line for line in capfd.readouterr().err.splitlines() if "_failing_hook" in line]
    assert len(said) == 1, said
    (line,) = said
    assert line.startswith("leakgate: DataLoader worker ") and str(os.getpid()) not in line
    assert line.endswith(
        "its hook _failing_hook raised ValueError: no search here;"
        " dropped for the rest of its batches"
    )

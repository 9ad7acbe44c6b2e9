"""How attribution names and sizes holders: autograd graphs counted toward the holder that
keeps the most, submodules named by their path from the model, tensors kept by garbage cycles,
a search cut short by its budget, and memory that torch.jit keeps on a trace's behalf."""

import gc

import pytest
import torch

from harness._attribution.graph import NODE_BYTES
from harness._attribution.holders import Holder, attribute
from harness._attribution.snapshot import live_tensors


def floats(n: int) -> torch.Tensor:
    """A float32 tensor of ``4 * n`` bytes."""
    return torch.ones(n)


def by_path(holders: list[Holder]) -> dict[str, Holder]:
    return {h.path: h for h in holders}


pytestmark = pytest.mark.usefixtures("heap_frozen")


# -- graphs ---------------------------------------------------------------------------------------


def test_losses_kept_with_their_graphs_are_credited_with_every_step_and_outrank_adam():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128)
    )
    optimizer = torch.optim.Adam(model.parameters())
    before = live_tensors()
    losses = []
    for _ in range(4):
        optimizer.zero_grad()
        model(torch.randn(8, 128)).pow(2).mean().backward()
        optimizer.step()
        # An evaluation logged as a tensor, graph and all: the leak.
        x = torch.randn(48, 128)
        out = model(x)
        losses.append(out.pow(2).mean())
    holders = attribute(before, limit=None)
    del x, out
    name = "test_losses_kept_with_their_graphs_are_credited_with_every_step_and_outrank_adam"
    kept, adam = by_path(holders)[f"{name}:losses"], by_path(holders)["Adam.state"]
    # Each step's graph saved x, the ReLU's output and `out`: 48 x 128 floats each. The last
    # step's are also reached from the loop's variables, which keep less than the list does.
    # Its seven nodes (mean, pow, two addmm, two transposes, relu) count too.
    step = 3 * 48 * 128 * 4 + 7 * NODE_BYTES
    assert kept.graph_bytes == 4 * step
    assert kept.bytes == 4 * step + 4 * 4
    # Adam's two moments of 2 x (128 x 128 + 128) floats, and a step count per parameter: more
    # than three steps' graphs, less than four.
    assert adam.bytes == 2 * 2 * (128 * 128 + 128) * 4 + 4 * 4
    assert holders.index(kept) < holders.index(adam)
    assert not {f"{name}:x", f"{name}:out"} & set(by_path(holders))


# -- module paths ---------------------------------------------------------------------------------


class Recording(torch.nn.Linear):
    """A layer that keeps every output it computes (detached)."""

    def __init__(self, n: int) -> None:
        super().__init__(n, n)
        self.activations: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        self.activations.append(y.detach())
        return y


class Trainer:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model


def test_layers_of_one_class_are_named_by_their_path_from_the_model():
    model = torch.nn.Sequential(Recording(16), Recording(16), Recording(16))
    before = live_tensors()
    for rows in (4, 8, 12):
        model(torch.randn(rows, 16))
    holders = attribute(before, limit=None)
    name = "test_layers_of_one_class_are_named_by_their_path_from_the_model"
    assert sorted(h.path for h in holders) == [f"{name}:model.{i}.activations" for i in range(3)]
    assert {(h.items, h.bytes) for h in holders} == {(3, (4 + 8 + 12) * 16 * 4)}


def test_a_submodule_under_an_attribute_is_named_from_that_attribute():
    trainer = Trainer(torch.nn.Sequential(torch.nn.ReLU(), Recording(8)))
    before = live_tensors()
    trainer.model(torch.randn(2, 8))
    [holder] = attribute(before)
    assert holder.path == "Trainer.model.1.activations"


def test_a_top_level_module_keeps_its_class_name():
    layer = Recording(8)
    before = live_tensors()
    layer(torch.randn(2, 8))
    [holder] = attribute(before)
    assert holder.path == "Recording.activations"


# -- dead ends ------------------------------------------------------------------------------------


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_a_tensor_kept_only_by_a_garbage_cycle_is_named_by_the_cycles_class_and_attribute():
    before = live_tensors()
    gc.disable()
    try:
        kept = floats(5000)
        a, b = Node(), Node()
        a.other, b.other = b, a
        a.kept = kept
        del a, b, kept
        [holder] = attribute(before)
    finally:
        gc.enable()
        gc.collect()
    assert (holder.path, holder.container, holder.bytes) == ("Node.kept", "tensor", 20000)
    assert holder.note == "kept only by a reference cycle, or by C code; gc is disabled"


def test_a_search_cut_short_names_what_it_reached_and_counts_what_it_did_not():
    before = live_tensors()
    near = floats(100)
    kept = [floats(10) for _ in range(3)]
    holders = attribute(before, max_objects=0)
    name = "test_a_search_cut_short_names_what_it_reached_and_counts_what_it_did_not"
    assert [(h.path, h.tensors) for h in holders] == [(f"{name}:near", 1), ("<not searched>", 3)]
    assert holders[1].note == (
        "3 tensors the search did not reach within its budget of 0 objects (max_objects)"
    )
    assert "3 tensors the search did not reach" in str(holders[1])
    del near, kept


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_traced_modules_kept_per_batch_are_named_with_the_inputs_torch_jit_keeps():
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU())
    before = live_tensors()
    traced = []
    for _ in range(3):
        traced.append(torch.jit.trace(model, torch.randn(64, 32)))
    [holder] = attribute(before)
    name = "test_traced_modules_kept_per_batch_are_named_with_the_inputs_torch_jit_keeps"
    assert (holder.path, holder.container, holder.items) == (f"{name}:traced", "list", 3)
    assert holder.bytes == 3 * 64 * 32 * 4
    assert holder.note == "torch.jit keeps each trace's example inputs"
    del traced

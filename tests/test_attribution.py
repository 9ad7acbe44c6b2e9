import gc
import sys
import weakref
from typing import ClassVar

import pytest
import torch
from workload import Windows, make_model

import harness._attribution.holders as holders_module
from harness import Recorder
from harness._attribution import names
from harness._attribution.findings import explain
from harness._attribution.graph import NODE_BYTES
from harness._attribution.holders import Holder, attribute
from harness._attribution.phase import PhaseAttribution
from harness._attribution.sites import record_sites
from harness._attribution.snapshot import live_tensors, storage_of
from harness._core.units import format_size
from tft.trainer import TrainConfig, Trainer

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
MODULE = __name__
CACHE: dict[str, torch.Tensor] = {}


def cuda(test):
    """Mark ``test`` as a CUDA test (``-m cuda``), skipped without a GPU."""
    return pytest.mark.cuda(needs_gpu(test))


class Cache:
    def __init__(self) -> None:
        self._items: list[torch.Tensor] = []


def floats(n: int, device: str = "cpu") -> torch.Tensor:
    """A float32 tensor of ``4 * n`` bytes."""
    return torch.ones(n, device=device)


def by_path(holders: list[Holder]) -> dict[str, Holder]:
    return {h.path: h for h in holders}


pytestmark = pytest.mark.usefixtures("heap_frozen")


@pytest.fixture
def global_cache():
    """Empties the module's ``CACHE`` after the test (which uses the global itself, so that no
    frame local names it first)."""
    yield
    CACHE.clear()


def test_an_attribute_list_is_named_by_class_and_attribute():
    before = live_tensors()
    cache = Cache()
    cache._items += [floats(256) for _ in range(4)]
    [holder] = attribute(before)
    assert holder.path == "Cache._items"
    assert (holder.container, holder.items, holder.tensors) == ("list", 4, 4)
    assert holder.bytes == 4 * 1024
    assert str(holder) == f"Cache._items (list, 4 items, {format_size(4096)})"
    one = Holder("run:loss", "tensor", 1, 1, 4096)
    assert str(one) == f"run:loss (tensor, 1 item, {format_size(4096)})"
    del cache


def test_a_module_global_dict_is_named_by_module(global_cache):
    before = live_tensors()
    CACHE["a"] = floats(512)
    CACHE["b"] = floats(512)
    [holder] = attribute(before)
    assert (holder.path, holder.container, holder.items) == (f"{MODULE}.CACHE", "dict", 2)
    assert holder.bytes == 4096


def test_nested_containers_are_described_where_the_tensors_gather(global_cache):
    before = live_tensors()
    CACHE["attn"] = [(floats(64), floats(64)) for _ in range(5)]
    [holder] = attribute(before)
    assert holder.path == f"{MODULE}.CACHE['attn']"
    assert (holder.container, holder.items, holder.tensors) == ("list", 5, 10)


class Owner:
    pass


def test_a_key_that_is_no_plain_value_is_shown_by_its_type(global_cache):
    """A path is the same text from run to run: a key whose ``repr`` holds an address (an
    object, a weak reference) is shown by its type."""
    for key, shown in ((Owner(), "<Owner>"), ((1, "a"), "(1, 'a')")):
        before = live_tensors()
        CACHE[key] = {"history": [floats(64) for _ in range(3)]}
        [holder] = attribute(before)
        assert holder.path == f"{MODULE}.CACHE[{shown}]['history']"
        CACHE.clear()


def make_closure():
    kept = [floats(100), floats(100)]

    def read() -> list[torch.Tensor]:
        return kept

    return read


def test_a_closure_cell_is_named_by_the_function_that_defines_it():
    before = live_tensors()
    read = make_closure()
    [holder] = attribute(before)
    assert (holder.path, holder.container, holder.items) == ("make_closure:kept", "list", 2)
    assert holder.bytes == 800
    del read


def test_a_frame_local_is_named_by_function_and_variable():
    gc.unfreeze()
    before = live_tensors()
    kept = floats(300)
    [holder] = attribute(before)
    assert holder.path == "test_a_frame_local_is_named_by_function_and_variable:kept"
    assert (holder.container, holder.items, holder.bytes) == ("tensor", 1, 1200)
    del kept


def test_reading_frame_locals_does_not_keep_a_dropped_local_alive():
    before = live_tensors()
    kept = floats(1000)
    gone = weakref.ref(kept)
    assert attribute(before)
    del kept
    assert gone() is None


def test_views_share_their_storage_and_count_once():
    before = live_tensors()
    base = floats(1000)
    cache = Cache()
    cache._items += [base[i * 100 : (i + 1) * 100] for i in range(10)]
    also = [base[:10], base.view(10, 100)]
    holders = attribute(before, limit=None)
    # One storage, three holders of it: it counts once, for the one holding most tensors.
    assert [(h.path, h.tensors, h.bytes) for h in holders] == [("Cache._items", 10, 4000)]
    del base, cache, also


def test_views_of_older_storage_hold_nothing_new():
    base = floats(1000)
    before = live_tensors()
    cache = Cache()
    cache._items += [base[:10], base[10:20]]
    assert attribute(before) == []
    del cache


def test_a_graph_attached_loss_holds_the_activations_its_graph_saved():
    weight = floats(1000).requires_grad_()
    before = live_tensors()
    x = torch.randn(1000)
    activation = (x * weight).tanh()
    kept = [activation.sum()]
    del x, activation
    [holder] = attribute(before)
    del kept
    assert holder.path == "test_a_graph_attached_loss_holds_the_activations_its_graph_saved:kept"
    # MulBackward saved x (the weight is older), TanhBackward its result: 4000 B each, plus the
    # three nodes (sum, tanh, mul) and the loss's own 4 bytes. Without the walk of grad_fn only
    # those 4 bytes would show.
    assert holder.graph_bytes == 8000 + 3 * NODE_BYTES
    assert holder.bytes == 8004 + 3 * NODE_BYTES
    assert holder.tensors == 1


def test_graphs_shared_by_several_tensors_count_once():
    weight = floats(1000).requires_grad_()
    before = live_tensors()
    hidden = (torch.randn(1000) * weight).exp()
    cache = Cache()
    cache._items += [hidden.sum(), hidden.mean()]
    del hidden
    [holder] = attribute(before)
    assert holder.graph_bytes == 8000 + 4 * NODE_BYTES  # mul and exp; sum and mean once each


def test_a_loss_kept_after_backward_still_keeps_its_graphs_nodes():
    weight = floats(1000).requires_grad_()
    before = live_tensors()
    kept = [(torch.randn(1000) * weight).tanh().sum()]
    kept[0].backward()  # frees what the graph saved; its three nodes stay
    [holder] = attribute(before)
    assert holder.graph_bytes == 3 * NODE_BYTES
    del kept


def test_reference_cycles_terminate_and_are_named(global_cache):
    before = live_tensors()
    a: dict = {}
    b = {"back": a, "tensor": floats(50)}
    a["forth"] = b
    CACHE["cycle"] = a
    del a, b
    [holder] = attribute(before)
    assert holder.path == f"{MODULE}.CACHE['cycle']['forth']"
    assert (holder.container, holder.items, holder.bytes) == ("dict", 2, 200)


def test_a_holder_deeper_than_max_depth_is_unnamed(global_cache):
    before = live_tensors()
    chain: list = [floats(10)]
    for _ in range(20):
        chain = [chain]
    CACHE["deep"] = chain
    del chain
    [shallow] = attribute(before, max_depth=5)
    assert shallow.path.startswith("<unnamed list>")
    [deep] = attribute(before, max_depth=30)
    assert deep.path == f"{MODULE}.CACHE['deep']" + "[0]" * 20


def test_the_object_budget_bounds_the_search():
    before = live_tensors()
    heap = [[object() for _ in range(100)] for _ in range(2000)]
    kept = [floats(10) for _ in range(3)]
    holders = attribute(before, max_objects=0)
    assert [(h.path, h.tensors, h.bytes) for h in holders] == [("<not searched>", 3, 120)]
    [holder] = attribute(before)
    assert holder.path == "test_the_object_budget_bounds_the_search:kept"
    del heap, kept


def test_objects_frozen_before_the_snapshot_still_name_their_tensors():
    cache = Cache()
    gc.freeze()
    before = live_tensors()
    cache._items.append(floats(64))
    assert gc.get_referrers(cache._items) == []
    [holder] = attribute(before)
    assert holder.path == "Cache._items"


def test_without_a_snapshot_module_and_optimizer_state_are_left_out():
    gc.unfreeze()
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 64)).sum().backward()
    optimizer.step()
    kept = [floats(4096)]
    holders = by_path(attribute(limit=None))
    held = holders["test_without_a_snapshot_module_and_optimizer_state_are_left_out:kept"]
    assert held.bytes == 4 * 4096
    assert not [p for p in holders if p.startswith(("Linear.", "Adam.", "<outside"))]
    del model, optimizer, kept


def test_snapshots_hold_tensors_weakly():
    tensor = floats(10)
    snapshot = live_tensors()
    assert tensor in snapshot and floats(10) not in snapshot
    gone = weakref.ref(tensor)
    del tensor
    assert gone() is None


def test_holders_round_trip_through_dicts():
    holder = Holder("Trainer._attn_cache", "list", 176, 176, 2_500_000, 2_400_000, ("m.py:3",))
    data = holder.to_dict()
    assert {"path", "container", "items", "bytes", "sites", "phase"} <= set(data)
    assert data["sites"] == ["m.py:3"]
    assert Holder.from_dict({**data, "unknown": 1}) == holder
    assert str(holder) == f"Trainer._attn_cache (list, 176 items, {format_size(2_500_000)})"


def test_max_depth_must_be_positive():
    with pytest.raises(ValueError, match="max_depth"):
        attribute(max_depth=0)


# -- the recorder -----------------------------------------------------------------------------


def test_a_recorder_without_attribution_takes_no_snapshots():
    with Recorder("cpu") as rec:
        with rec.phase("validation"):
            rec.checkpoint("OOM")
        assert rec.attribution is None and rec.holders == []


def test_attribute_takes_a_bool_or_a_phase_attribution():
    with pytest.raises(TypeError, match="attribute"):
        Recorder("cpu", attribute="yes")


def test_a_phase_end_attributes_what_the_phase_left():
    cache = Cache()
    with Recorder("cpu", attribute=True) as rec, rec.phase("validation", epoch=2):
        for batch in range(5):
            cache._items.append(floats(1024))
            rec.checkpoint("VALIDATION_BATCH", batch=batch)
    [holder] = rec.holders
    assert (holder.path, holder.items, holder.bytes) == ("Cache._items", 5, 5 * 4096)
    assert (holder.phase, holder.epoch, holder.label) == ("validation", 2, "validation END")


def test_an_oom_event_names_what_the_loop_holds_then():
    cache = Cache()
    with Recorder("cpu", attribute=True) as rec:
        rec.checkpoint("VALIDATION_START", phase="validation")
        for batch in range(3):
            cache._items.append(floats(1024))
            rec.checkpoint("VALIDATION_BATCH", phase="validation", batch=batch)
        rec.checkpoint("OOM", phase="validation", batch=3, note="CUDA out of memory")
        cache._items.clear()
        rec.checkpoint("VALIDATION_END", phase="validation")
    [holder] = rec.holders
    assert (holder.path, holder.items, holder.label) == ("Cache._items", 3, "OOM")


def test_growth_past_the_threshold_is_named_mid_phase_and_again_when_it_doubles():
    cache = Cache()
    attribution = PhaseAttribution(growth="1200KiB")
    with Recorder("cpu", attribute=attribution) as rec, rec.phase("val"):
        for batch in range(8):
            cache._items.append(floats(2**17))  # 512 KiB a batch
            rec.checkpoint("VALIDATION_BATCH", batch=batch)
        cache._items.clear()  # nothing left for the END to name
    crossed, doubled = rec.holders
    assert {h.path for h in rec.holders} == {"Cache._items"}
    assert {h.label for h in rec.holders} == {"VALIDATION_BATCH"}
    # Past 1200 KiB above batch 0 at batch 3 (4 items), past twice that at batch 6 or 7.
    assert crossed.items == 4 and doubled.items in (7, 8)
    assert crossed.growth is not None and doubled.growth is not None
    assert doubled.growth >= 2 * crossed.growth


def test_growth_is_counted_after_warm_up_as_the_leak_rule_counts_it():
    cache = Cache()
    attribution = PhaseAttribution(growth="1200KiB", warmup=3, at_end=False)
    with Recorder("cpu", attribute=attribution) as rec, rec.phase("val"):
        for batch in range(8):
            cache._items.append(floats(2**17))
            rec.checkpoint("VALIDATION_BATCH", batch=batch)
    first = rec.holders[0]
    # The base is batch 3 (4 items); 1200 KiB above it is passed at batch 6: 3 items are new.
    assert (first.items, first.tensors) == (7, 3)
    cache._items.clear()


@pytest.mark.parametrize("warmup", [-1, 1.5, True, "5"])
def test_a_warm_up_that_is_not_a_count_is_a_type_error(warmup):
    with pytest.raises(TypeError, match="warmup"):
        PhaseAttribution(warmup=warmup)


@pytest.mark.parametrize("at_end", [True, False])
def test_at_end_false_leaves_phase_ends_unsearched(at_end):
    cache = Cache()
    with Recorder("cpu", attribute=PhaseAttribution(at_end=at_end)) as rec, rec.phase("val"):
        cache._items.append(floats(2**17))
    assert [h.label for h in rec.holders] == (["val END"] if at_end else [])


class IncidentTrainer(Trainer):
    """The incident: validation keeps each batch's attention with its graph (run with grad, on
    a copy of the batch) and runs out of memory at the fourth batch."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._attn_cache: list[torch.Tensor] = []

    def validate_step(self, batch, acc):
        prediction = super().validate_step(batch, acc)
        keep = self.model.attention.register_forward_hook(
            lambda module, inputs, output: self._attn_cache.append(output[1])
        )
        with torch.inference_mode(False), torch.enable_grad():
            self.model({k: v.clone() for k, v in batch.items()})
        keep.remove()
        if len(self._attn_cache) == 4:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.40 GiB")
        return prediction


def test_the_incident_oom_names_the_attention_cache_and_its_graph():
    config = TrainConfig(epochs=1, batch_size=2, oom_retries=1)
    with Recorder("cpu", attribute=True) as rec:
        IncidentTrainer(make_model(), config, callbacks=[rec]).fit(Windows(4), Windows(12, seed=1))
    top = next(h for h in rec.holders if h.label == "OOM")
    assert (top.path, top.container, top.items) == ("IncidentTrainer._attn_cache", "list", 4)
    assert top.phase == "validation"
    assert top.graph_bytes > 0.9 * top.bytes


def test_an_allocators_blocks_give_sites_to_the_storages_they_hold(monkeypatch):
    """Blocks are keyed as storages are: a holder's storage takes the site of the block that
    holds it, and a block no storage accounts for is a holder of its own, by site. Shown with a
    stand-in allocator over host memory, as the CUDA one reports its blocks."""
    before = live_tensors()
    kept = [floats(2**18) for _ in range(2)]
    frames = [{"filename": "/src/train.py", "line": 7}]
    orphan = ("cpu", None, 1)
    blocks = [(storage_of(t)[0], 2**20, frames) for t in kept] + [(orphan, 4096, frames)]
    monkeypatch.setattr(holders_module, "allocator_blocks", lambda: blocks)
    found = by_path(attribute(before))
    held = found["test_an_allocators_blocks_give_sites_to_the_storages_they_hold:kept"]
    assert held.bytes == 2 * 2**20 and held.sites == ("/src/train.py:7",)
    unheld = found["<no Python holder> /src/train.py:7"]
    assert (unheld.container, unheld.items, unheld.bytes) == ("blocks", 1, 4096)
    del kept


# -- CUDA -------------------------------------------------------------------------------------


@cuda
def test_cuda_holders_carry_their_allocation_site():
    was_on = record_sites(True)
    try:
        before = live_tensors()
        line = sys._getframe().f_lineno + 1
        kept = [floats(2**18, "cuda") for _ in range(3)]
        holder = by_path(attribute(before))["test_cuda_holders_carry_their_allocation_site:kept"]
    finally:
        record_sites(was_on)
    assert holder.bytes == 3 * 2**20
    assert holder.sites[0].endswith(f"test_attribution.py:{line}")
    del kept


@cuda
def test_cuda_blocks_without_a_python_holder_are_grouped_by_site():
    was_on = record_sites(True)
    try:
        before = live_tensors()
        line = sys._getframe().f_lineno + 1
        pointer = torch.cuda.caching_allocator_alloc(2**20)
        try:
            holders = attribute(before)
        finally:
            torch.cuda.caching_allocator_delete(pointer)
    finally:
        record_sites(was_on)
    [unheld] = [h for h in holders if h.path.startswith("<no Python holder>")]
    assert unheld.sites[0].endswith(f"test_attribution.py:{line}")
    assert unheld.bytes >= 2**20 and unheld.container == "blocks"


@cuda
def test_a_cuda_recorder_records_sites_only_while_open():
    was_on = torch._C._cuda_isHistoryEnabled()
    with Recorder("cuda", attribute=True) as rec:
        assert torch._C._cuda_isHistoryEnabled()
        with rec.phase("validation"):
            kept = [floats(2**18, "cuda")]
    assert torch._C._cuda_isHistoryEnabled() == was_on
    [holder] = rec.holders
    assert holder.path.endswith(":kept") and holder.sites
    del kept


def finding(kind, phase):
    return type("Finding", (), {"kind": kind, "phase": phase})()


def test_explain_names_the_holders_of_the_failing_phase_and_searches_only_when_needed(
    monkeypatch,
):
    searched = []
    monkeypatch.setattr(
        "harness._attribution.findings.attribute",
        lambda **_: searched.append(1) or [Holder("mod.STORE", "list", 1, 1, 10)],
    )
    held = [
        Holder("Adam.state", "defaultdict", 9, 18, 5000, phase="training"),
        Holder("Cache.items", "list", 176, 176, 9000, phase="validation"),
        Holder("Trainer.small", "list", 1, 1, 1000, phase="validation"),
    ]
    assert explain(held, [finding("peak", "validation")]) == [] and not searched
    named = explain(held, [finding("leak", "validation")])
    assert [h.path for h in named] == ["Cache.items", "Trainer.small"] and not searched
    named = explain(held, [finding("oom", "validation"), finding("teardown", "session")])
    assert [h.path for h in named] == ["Cache.items", "Trainer.small", "mod.STORE"]
    assert explain([], [finding("leak", "training")])[0].path == "mod.STORE"
    twice = [*held, Holder("Cache.items", "list", 300, 300, 20000, phase="validation")]
    assert [h.items for h in explain(twice, [finding("leak", "validation")])] == [300, 1]


def test_leakgates_own_frames_are_never_holders():
    """A callback of leakgate's holding a batch's outputs in a local is not what to fix."""
    ours = {"__name__": "harness.integrations.example", "torch": torch, "attribute": attribute}
    exec(
        "def on_batch_end(before):\n"
        "    outputs = torch.ones(2**16)\n"
        "    return attribute(before, limit=None)\n",
        ours,
    )
    theirs = {**ours, "__name__": "myproject.callbacks"}
    exec(
        "def on_batch_end(before):\n"
        "    outputs = torch.ones(2**16)\n"
        "    return attribute(before, limit=None)\n",
        theirs,
    )
    before = live_tensors()
    assert not any("on_batch_end" in h.path for h in ours["on_batch_end"](before))
    assert any(h.path == "on_batch_end:outputs" for h in theirs["on_batch_end"](before))


class _Proxy:
    """Slots only, and a ``__getattr__`` that must not run while its attributes are read."""

    __slots__ = ("payload",)
    asked: ClassVar[list[str]] = []

    def __getattr__(self, name):
        _Proxy.asked.append(name)
        raise AttributeError(name)


def test_attributes_are_read_without_running_getattr():
    proxy = _Proxy()
    proxy.payload = torch.ones(4)
    assert list(names._attributes(proxy)) == [("payload", proxy.payload)]
    assert names.namespace(proxy) is None and _Proxy.asked == []

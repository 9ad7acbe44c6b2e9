"""Holders by retained size: each leak shape is made after a snapshot and searched once; the
holder named must be what a user cuts (its path) and retain at least half of the new memory
the search weighed. Each leak has a clean twin, which leaves nothing large to name.

``SHAPES`` are the leaks that were named as one slice before (a hook per batch, numpy in a
module dict, optimizers in a monitor, model copies, handlers, stored exceptions, a method's
cache); ``UNSEEN`` are shapes the search was not designed around."""

import collections
import copy
import functools
import gc
import io
import logging
import queue
import re
import weakref
from typing import ClassVar

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import harness._attribution.retained as retained_module
from harness import Recorder
from harness._attribution.phase import PhaseAttribution
from harness._attribution.retained import retained_holders, retained_of
from harness._attribution.snapshot import live_tensors
from harness._attribution.weights import size_of

BATCHES = 24
SHARE = 0.5
_PREDICTIONS: dict[str, dict[str, np.ndarray]] = {}


@pytest.fixture(autouse=True)
def heap_frozen():
    froze = gc.get_freeze_count() == 0
    gc.collect()
    gc.freeze()
    yield
    _PREDICTIONS.clear()
    Registry.items.clear()
    if froze:
        gc.unfreeze()


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))


def batch() -> torch.Tensor:
    return torch.randn(64, 64)


# -- the shapes that were named by one slice ------------------------------------------------------


class FeatureExtractor:
    def __init__(self, layer: torch.nn.Module) -> None:
        self.features = None
        layer.register_forward_hook(self._grab)

    def _grab(self, module, inputs, output):
        self.features = output.detach().clone()


def hooks(leak: bool):
    net = model()
    if not leak:
        FeatureExtractor(net[0])
    for _ in range(BATCHES):
        if leak:
            FeatureExtractor(net[0])
        net(batch())
    return net


def predictions(leak: bool):
    net = model()
    for i in range(BATCHES):
        with torch.no_grad():
            out = net(batch()).numpy()
        if leak:
            _PREDICTIONS[f"val/{i}"] = {"pred": out.copy(), "target": np.tile(out, 2)}
    return net


class Monitor:
    def __init__(self) -> None:
        self.schedulers: list = []


def optimizers(leak: bool):
    net, monitor = model(), Monitor()
    for _ in range(6):  # epochs
        optimizer = torch.optim.AdamW(net.parameters())
        net(batch()).sum().backward()
        optimizer.step()
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
        monitor.schedulers = [*monitor.schedulers, scheduler] if leak else [scheduler]
    return monitor


class Keeper:
    def __init__(self) -> None:
        self.copies: list = []


def copies(leak: bool):
    net, keeper = model(), Keeper()
    for _ in range(6):
        best = copy.deepcopy(net)
        keeper.copies = [*keeper.copies, best] if leak else [best]
    return keeper


def handlers(leak: bool):
    log = logging.getLogger(f"retained.{leak}")
    log.propagate = False
    log.handlers.clear()
    if not leak:
        log.addHandler(logging.StreamHandler(io.StringIO("x" * 4096)))
    for _ in range(200):
        if leak:
            log.addHandler(logging.StreamHandler(io.StringIO("x" * 4096)))
    return log


def exceptions(leak: bool):
    net, errors = model(), []

    def checked(x):
        out = net(x)  # noqa: F841  (kept by the frame a traceback holds)
        raise ValueError("out of range")

    for _ in range(BATCHES):
        try:
            checked(batch())
        except ValueError as error:
            errors.append(error if leak else repr(error))
    return errors


class Encoder:
    def __init__(self) -> None:
        self.net = model()

    @functools.cache  # noqa: B019
    def encode(self, x):
        return self.net(x)

    @functools.cache  # noqa: B019
    def mask(self, n):
        return torch.ones(n, n).tril()


def cached(leak: bool):
    encoder = Encoder()
    for _ in range(BATCHES):
        encoder.encode(batch()) if leak else encoder.net(batch()) @ encoder.mask(64)
    return encoder


SHAPES = {
    "hooks": (hooks, r"\.0\._forward_hooks$", r"bound FeatureExtractor\._grab"),
    "predictions": (predictions, r"test_retained\._PREDICTIONS$", r"dict"),
    "optimizers": (optimizers, r"Monitor\.schedulers$", r"StepLR"),
    "copies": (copies, r"Keeper\.copies$", r"Sequential"),
    "handlers": (handlers, r"Logger\.handlers$", r"StreamHandler"),
    "exceptions": (exceptions, r":held$", r"ValueError"),
    "cached": (cached, r"Encoder\.encode", r""),
}


# -- shapes the search was not designed around ---------------------------------------------------


def callbacks(leak: bool):
    net, hooks = model(), []
    for _ in range(BATCHES):
        out = net(batch())
        if leak:
            hooks.append(lambda out=out: out.sum())
    return hooks


def deques(leak: bool):
    stats = collections.defaultdict(collections.deque)
    for i in range(BATCHES):
        value = np.ones(4096)
        stats[i % 4].append(value) if leak else stats[i % 4].append(float(value.sum()))
    return stats


class Registry:
    items: ClassVar[list] = []


def registry(leak: bool):
    for _ in range(BATCHES):
        value = torch.ones(16384)
        if leak:
            Registry.items.append(value)
    return None


class Blob:
    def __init__(self) -> None:
        self.data = torch.ones(16384)


def weak_values(leak: bool):
    cache, strong = weakref.WeakValueDictionary(), []
    for i in range(BATCHES):
        blob = Blob()
        cache[i] = blob
        if leak:
            strong.append(blob)
    return cache, strong


def generator(leak: bool):
    def produce():
        seen = []
        while True:
            value = torch.ones(16384)
            if leak:
                seen.append(value)
            yield value

    made = produce()
    for _ in range(BATCHES):
        next(made)
    return made


class Node:
    def __init__(self, value) -> None:
        self.value = value
        self.me = self


def cycles(leak: bool):
    gc.disable()
    try:
        for _ in range(BATCHES):
            node = Node(torch.ones(16384))
            if not leak:
                node.me = None
        del node
        return None
    finally:
        gc.enable()


def nested(leak: bool):
    results = {"train": [], "val": []}
    for _ in range(BATCHES):
        step = {"logits": torch.ones(8192), "labels": torch.ones(8192)}
        if leak:
            results["val"].append(step)
    return results


def undrained(leak: bool):
    pending = queue.Queue()
    for _ in range(BATCHES):
        pending.put(torch.ones(16384))
        if not leak:
            pending.get()
    return pending


def partials(leak: bool):
    jobs = []
    for _ in range(BATCHES):
        job = functools.partial(torch.add, torch.ones(16384))
        jobs.append(job) if leak else job(1)
    return jobs


class Store:
    def __init__(self) -> None:
        self.arrays: list = []


def arrays(leak: bool):
    store = Store()
    for _ in range(BATCHES):
        if leak:
            store.arrays.append(np.ones(8192))
    return store


class Link:
    def __init__(self, value, below):
        self.value, self.below = value, below


class Tracker:
    def __init__(self):
        self.head = None


def chain(leak: bool):
    tracker, net = Tracker(), model()
    for _ in range(BATCHES):
        out = net(batch()).detach()
        tracker.head = Link(out, tracker.head if leak else None)
    return tracker


class Running:
    def __init__(self):
        self.outputs = np.zeros((0, 64), dtype=np.float32)


def regrown(leak: bool):
    running, net = Running(), model()
    for _ in range(BATCHES):
        out = net(batch()).detach().numpy()
        running.outputs = np.concatenate([running.outputs, out]) if leak else out
    return running


UNSEEN = {
    "callbacks": (callbacks, r":held$", r"function"),
    "deques": (deques, r":held$", r"deque"),
    "registry": (registry, r"Registry\.items$", r"tensor"),
    "weak_values": (weak_values, r":held\[1\]$", r"Blob"),
    "generator": (generator, r"produce:seen$", r"tensor"),
    "cycles": (cycles, r"<unnamed Node>", r""),
    "nested": (nested, r"\['val'\]$", r"dict"),
    "undrained": (undrained, r"Queue\.queue$", r"tensor"),
    "partials": (partials, r":held$", r"partial"),
    "arrays": (arrays, r"Store\.arrays$", r"ndarray"),
    "chain": (chain, r"Tracker\.head$", r""),
    "regrown": (regrown, r"Running\.outputs$", r""),
}


def search(shape, leak: bool):
    """Run ``shape`` after a snapshot, keep what it returns, search once: the holders. It runs
    once before, so that what its first run imports (an optimizer's modules) is not new."""
    shape(leak)
    _PREDICTIONS.clear()
    Registry.items.clear()
    gc.collect()
    before = live_tensors(objects=True)
    held = shape(leak)
    found = retained_holders(before, 1_000_000)
    del held
    return found


@pytest.mark.parametrize("name", [*SHAPES, *UNSEEN])
def test_a_leak_is_named_where_it_accumulates_and_its_clean_twin_is_not(name):
    shape, path, items = {**SHAPES, **UNSEEN}[name]
    found = search(shape, leak=True)
    assert found, name
    top = found[0]
    assert re.search(path, top.path), (name, found)
    assert re.search(items, top.note), (name, top)
    assert top.bytes >= SHARE * top.growth, (name, top)
    clean = search(shape, leak=False)
    assert not [h for h in clean if re.search(path, h.path) and h.bytes > top.bytes / 4], clean


def test_during_a_run_the_accumulation_point_replaces_the_slices():
    attribution = PhaseAttribution(growth="256KB", warmup=2)
    recorder = Recorder(attribute=attribution)
    net = model()
    try:
        with recorder.phase("validation"):
            for i in range(40):
                FeatureExtractor(net[0])
                net(torch.randn(256, 64))
                recorder.checkpoint("VALIDATION_BATCH", batch=i)
    finally:
        recorder.close()
    last = [h for h in attribution.holders if h.label == "VALIDATION_BATCH"][-3:]
    assert last[-1].path.endswith("._forward_hooks"), last
    assert last[-1].bytes >= SHARE * last[-1].growth
    assert sum(h.bytes for h in last if h.growth == last[-1].growth) <= 2 * last[-1].growth


@pytest.mark.parametrize(("leak", "chunk"), [(True, None), (False, None), (True, 1)])
def test_an_array_regrown_into_an_old_objects_attribute_is_named_by_it(monkeypatch, leak, chunk):
    """The object that holds the array was made before the phase's census (after the
    recorder's freeze), so it is not new: what it refers to that the census did not note (by
    id and size) is, and what it held then (a table it never changes) is not. Old objects
    are read a chunk at a time: the same holder whatever the chunk's size."""
    if chunk is not None:
        monkeypatch.setattr(retained_module, "_CHUNK", chunk)
    net, attribution = model(), PhaseAttribution(growth="256KB", warmup=2)
    with Recorder(attribute=attribution) as recorder, recorder.phase("validation"):
        running = Running()
        running.table = np.ones(1 << 18)  # 2 MiB, made before the census, never new
        for i in range(BATCHES):
            out = net(torch.randn(256, 64)).detach().numpy()
            running.outputs = np.concatenate([running.outputs, out]) if leak else out
            recorder.checkpoint("VALIDATION_BATCH", batch=i)
    assert not [h for h in attribution.holders if "table" in h.path], attribution.holders
    named = [h for h in attribution.holders if h.path.endswith("Running.outputs")]
    assert bool(named) == leak, attribution.holders
    if leak:
        assert named[-1].bytes >= SHARE * named[-1].growth, named
        assert (named[-1].container, named[-1].items) == ("ndarray", 1), named


@pytest.mark.parametrize("leak", [True, False])
def test_a_buffer_grown_in_place_is_named_by_what_holds_it(leak):
    """A buffer made before the phase's census that grows in place is no new object: what it
    grew by since the census is weighed on it."""
    net, attribution = model(), PhaseAttribution(growth="256KB", warmup=2)
    with Recorder(attribute=attribution) as recorder, recorder.phase("validation"):
        saved = {"outputs": io.BytesIO()}
        for i in range(BATCHES):
            out = net(torch.randn(256, 64)).detach()
            if not leak:
                saved["outputs"] = io.BytesIO()
            torch.save(out, saved["outputs"])
            recorder.checkpoint("VALIDATION_BATCH", batch=i)
    named = [h for h in attribution.holders if h.path.endswith("saved['outputs']")]
    assert bool(named) == leak, attribution.holders
    if leak:
        assert named[-1].bytes >= SHARE * named[-1].growth, named


@pytest.mark.parametrize("leak", [True, False])
def test_a_storage_resized_in_place_is_named_by_its_tensor(leak):
    """A tensor made before the phase's census whose storage grows by ``resize_`` is no new
    tensor: what its storage grew by since the census is weighed on it."""
    net, attribution = model(), PhaseAttribution(growth="256KB", warmup=2)
    with Recorder(attribute=attribution) as recorder, recorder.phase("validation"):
        gathered = torch.zeros(0, 64)
        for i in range(BATCHES):
            out = net(torch.randn(256, 64)).detach()
            rows = len(gathered) + len(out) if leak else len(out)
            gathered.resize_(rows, 64)[-len(out) :] = out
            recorder.checkpoint("VALIDATION_BATCH", batch=i)
    named = [h for h in attribution.holders if h.path.endswith(":gathered") and h.bytes > 2**18]
    assert bool(named) == leak, attribution.holders
    if leak:
        assert named[-1].bytes >= SHARE * named[-1].growth, named


class Vertex:
    """A node of a random object graph: a payload of its own and the blobs it refers to."""

    __slots__ = ("__weakref__", "payload", "refs")

    def __init__(self, size: int) -> None:
        self.payload = bytearray(size)
        self.refs: list = []


@st.composite
def object_graphs(draw):
    size = draw(st.integers(1, 7))
    nodes = st.integers(0, size - 1)
    edges = draw(st.lists(st.tuples(nodes, nodes), max_size=3 * size))
    roots = draw(st.lists(nodes, min_size=1, max_size=3, unique=True))
    payloads = draw(st.lists(st.integers(300, 5000), min_size=size, max_size=size))
    return edges, roots, payloads


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(object_graphs())
def test_retained_sizes_of_a_random_object_graph_are_what_removing_an_object_frees(graph):
    edges, roots, payloads = graph
    before = live_tensors(objects=True)
    blobs = [Vertex(size) for size in payloads]
    for a, b in edges:
        blobs[a].refs.append(blobs[b])
    held = [blobs[i] for i in roots]  # the root: this frame's local
    refs = [weakref.ref(b) for b in blobs]
    del blobs  # only ``held`` keeps them: the search is asked about them by weak reference
    gc.collect()  # cycles that nothing keeps
    found = retained_of(before, [ref() for ref in refs], 1_000_000)
    blobs = [ref() for ref in refs]

    def weight(blob: Vertex) -> int:
        return size_of(blob) + size_of(blob.refs) + size_of(blob.payload)

    def reached(removed=None) -> set[int]:
        seen, stack = set(), [b for b in held if b is not removed]
        while stack:
            blob = stack.pop()
            if id(blob) not in seen:
                seen.add(id(blob))
                stack += [r for r in blob.refs if r is not removed]
        return seen

    alive = reached()
    for blob, kept in zip(blobs, found, strict=True):
        if id(blob) not in alive:
            continue  # garbage: nothing keeps it
        freed = alive - reached(removed=blob)
        assert kept == sum(weight(b) for b in blobs if id(b) in freed), (edges, roots)


class History:
    values: ClassVar[collections.defaultdict] = collections.defaultdict(list)


def metrics_by_name(leak: bool) -> None:
    """Each batch's four metrics, 0-d views of one storage, kept in a list per metric name."""
    History.values.clear()
    for _ in range(60):
        scores = torch.randn(64, 4)
        for name, column in zip("abcd", scores.T, strict=True):
            values = column.unbind()
            if leak:
                History.values[name].extend(values)


def test_a_dict_subclass_counts_its_keys_as_items_whatever_it_dominates():
    """The four lists share each batch's storage, which only the defaultdict dominates: its
    items are still its four keys."""
    found = search(metrics_by_name, leak=True)
    top = found[0]
    assert top.path.endswith("History.values"), found
    assert (top.container, top.items) == ("defaultdict", 4), top
    assert top.bytes >= SHARE * top.growth, top

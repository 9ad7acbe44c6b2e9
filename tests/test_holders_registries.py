"""Holders that registries keep, named as users meet them through ``pytest --memreport``: what
torch.jit and torch.fx keep for each trace (reachable from ``sys.modules``, partly kept by C++),
logging's loggers and handlers, and a function's mutable default. Each leak names the holder a
user cuts, with at least half of the growth; its clean twin passes."""

import ctypes
import gc
import re

import pytest

import harness._recorder  # noqa: F401
from harness._attribution.retained import retained_holders
from harness._attribution.snapshot import live_tensors

# harness._recorder imported here is in every snapshot pytester restores (see
# tests/test_holders_as_run.py).

CASES = """
import logging
import logging.handlers
import threading

import pytest
import torch
from torch import nn

BUDGET = pytest.mark.memleak(phase="validation", max_growth="512KB", warmup=3)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(8, 8)

    def forward(self, x):
        return self.layer(x).relu()


def jit(model, x):
    return torch.jit.trace(model, x, check_trace=False)


def fx(model, x):
    return torch.fx.symbolic_trace(model)


def traced(memtrace, trace, model, again, batches):
    x = torch.randn(2, 8)
    once = trace(model, x)
    with memtrace.phase("validation", epoch=0):
        for i in range(batches):
            step = trace(model, x) if again else once
            step(x)
            memtrace.checkpoint("VALIDATION_BATCH", batch=i)


@BUDGET
def test_leak_a_model_traced_by_jit_per_batch(memtrace):
    traced(memtrace, jit, Tiny(), True, 30)


@BUDGET
def test_clean_a_model_traced_by_jit_once(memtrace):
    traced(memtrace, jit, Tiny(), False, 30)


class Named(nn.Module):
    # four layers with long names: each trace's source, which torch.fx keeps, is 15 KiB, more
    # than what each trace leaves to gc in reference cycles

    def __init__(self):
        super().__init__()
        self.names = ["projection_of_the_hidden_state_" * 32 + str(i) for i in range(4)]
        for name in self.names:
            setattr(self, name, nn.Linear(8, 8))

    def forward(self, x):
        for name in self.names:
            x = getattr(self, name)(x)
        return x


@BUDGET
def test_leak_a_model_traced_by_fx_per_batch(memtrace):
    traced(memtrace, fx, Named(), True, 300)


@BUDGET
def test_clean_a_model_traced_by_fx_once(memtrace):
    traced(memtrace, fx, Named(), False, 300)


def handlers(memtrace, remove):
    log = logging.getLogger("registries.batches")
    try:
        with memtrace.phase("validation", epoch=0):
            for i in range(2000):
                handler = logging.Handler()
                log.addHandler(handler)
                if remove:
                    log.removeHandler(handler)
                memtrace.checkpoint("VALIDATION_BATCH", batch=i)
    finally:
        for handler in list(log.handlers):
            log.removeHandler(handler)


@BUDGET
def test_leak_a_handler_added_per_batch(memtrace):
    handlers(memtrace, remove=False)


@BUDGET
def test_clean_a_handler_added_and_removed(memtrace):
    handlers(memtrace, remove=True)


# a logger outside logging's tree: pytest's own capture, which keeps every record (and its
# tensor arguments) for the test's report, never sees it
ACTIVATIONS = logging.Logger("registries.activations")


def buffered(memtrace, capacity):
    log = ACTIVATIONS
    handler = logging.handlers.MemoryHandler(
        capacity, flushLevel=logging.CRITICAL + 1, target=logging.NullHandler()
    )
    log.addHandler(handler)
    try:
        with memtrace.phase("validation", epoch=0):
            for i in range(40):
                log.warning("batch %d %s", i, torch.randn(16_384))
                memtrace.checkpoint("VALIDATION_BATCH", batch=i)
    finally:
        log.removeHandler(handler)


@BUDGET
def test_leak_tensors_buffered_by_a_memory_handler(memtrace):
    buffered(memtrace, capacity=100_000)


@BUDGET
def test_clean_a_memory_handler_flushed(memtrace):
    buffered(memtrace, capacity=4)


def remember(item, seen=[]):  # noqa: B006 - the leak under test
    seen.append(item)
    return seen


def remember_afresh(item, seen=None):
    seen = [] if seen is None else seen
    seen.append(item)
    return seen


def with_a_default(memtrace, remembering):
    with memtrace.phase("validation", epoch=0):
        for i in range(40):
            seen = remembering(torch.randn(16_384))  # the caller holds the same list
            memtrace.checkpoint("VALIDATION_BATCH", batch=i)
    return len(seen)


STATE = threading.local()


def kept_per_thread(memtrace, keep):
    STATE.cache = []
    with memtrace.phase("validation", epoch=0):
        for i in range(40):
            batch = torch.randn(16_384)
            if keep:
                STATE.cache.append(batch)
            memtrace.checkpoint("VALIDATION_BATCH", batch=i)
    del STATE.cache


@BUDGET
def test_leak_a_thread_local_cache(memtrace):
    kept_per_thread(memtrace, keep=True)


@BUDGET
def test_clean_a_thread_local_cache_kept_empty(memtrace):
    kept_per_thread(memtrace, keep=False)


@BUDGET
def test_leak_a_mutable_default_the_caller_holds(memtrace):
    with_a_default(memtrace, remember)


@BUDGET
def test_clean_a_default_made_afresh(memtrace):
    with_a_default(memtrace, remember_afresh)
"""

NAMED = {
    "a_model_traced_by_jit_per_batch": r"ConcreteTypeStore\.methods_compiled \(set, \d+ items",
    "a_model_traced_by_fx_per_batch": (
        r"(linecache\.cache|_EvalCacheLoader\.eval_cache) \(dict, \d+ items"
    ),
    "a_handler_added_per_batch": r"Logger\.handlers \(list, \d+ items",
    "tensors_buffered_by_a_memory_handler": r"MemoryHandler\.buffer \(list, \d+ items",
    "a_thread_local_cache": r"test_cases\.STATE\.cache \(list, 40 items",
    "a_mutable_default_the_caller_holds": (
        r"test_cases\.remember\.__defaults__\[0\] \(list, \d+ items"
    ),
}
HOLDER = re.compile(r"held (?:in \S+ \d+ )?by (.+) \([^,]+, \d+ items?, ([\d.]+)([KMG]i)?B")
HELD = re.compile(r"held: [\d.]+ of ([\d.]+) ([KMG]i)?B")
UNITS = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def outcomes(pytester: pytest.Pytester) -> dict[str, tuple[str, str]]:
    """Each case's outcome and failure text, run through the plugin."""
    pytester.makepyfile(test_cases=CASES)
    result = pytester.runpytest("-p", "no:randomly", "-p", "no:cacheprovider", "--memreport")
    reports = result.reprec.getreports("pytest_runtest_logreport")  # type: ignore[attr-defined]
    return {
        r.nodeid.split("::test_")[-1]: (r.outcome, str(r.longrepr or ""))
        for r in reports
        if r.when == "call"
    }


def miss(name: str, outcome: str, text: str) -> str | None:
    """What is wrong with one case's outcome, or None: a clean twin passes; a leak fails,
    named by the holder :data:`NAMED` gives, which holds at least half of the growth."""
    if name.startswith("clean_"):
        return None if outcome == "passed" else text
    if outcome != "failed":
        return "passed"
    holder, whole = HOLDER.search(text), HELD.search(text)
    named = NAMED[name[len("leak_") :]]
    if holder is None or whole is None or not re.match(named, text[holder.start(1) :]):
        return text
    held = float(holder[2]) * UNITS[holder[3]]
    return None if held >= 0.5 * float(whole[1]) * UNITS[whole[2]] else text


def test_each_registry_leak_names_its_holder_with_most_of_the_growth_and_its_twin_passes(
    pytester,
):
    found = outcomes(pytester)
    assert len(found) == 2 * len(NAMED)
    misses = {name: miss(name, *result) for name, result in found.items()}
    missed = sorted(name for name, text in misses.items() if text is not None)
    assert not missed, "\n\n".join(f"{name}: {misses[name]}" for name in missed)


class Node:
    def __init__(self) -> None:
        self.values = [float(i) for i in range(2000)]
        self.me = self


class Kept(Node):
    pass


def test_a_cycle_nothing_keeps_is_named_as_garbage_and_one_c_code_keeps_as_kept_by_c(
    heap_frozen,
):
    before = live_tensors(objects=True)
    gc.disable()
    kept = [Kept() for _ in range(12)]
    for node in kept:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(node))  # a reference only C code holds
    try:
        del node, kept
        for _ in range(12):
            Node()
        found = {h.path: h.note for h in retained_holders(before, 1_000_000)}
    finally:
        for node in [o for o in gc.get_objects() if type(o) is Kept]:
            ctypes.pythonapi.Py_DecRef(ctypes.py_object(node))
        gc.enable()
        gc.collect()
    assert found == {
        "<unnamed Node>": "garbage: a reference cycle, never freed while gc is disabled",
        "<unnamed Kept>": "kept only by C code (no named root reaches it)",
    }

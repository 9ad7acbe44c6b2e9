"""Searches beside a user's own tools, and over objects that refuse inspection: a search runs
where no tracer or profiler records it, steps aside (saying why) under another memory tracer,
keeps within its caps, never runs an object's own code, and skips what refuses to answer."""

import sys
import threading
import tracemalloc
import weakref
from unittest import mock

import pytest
import torch

from harness import Recorder
from harness._attribution import phase, walk
from harness._attribution.holders import attribute
from harness._attribution.phase import PhaseAttribution
from harness._attribution.quiet import memory_tracer, unobserved, watched
from harness._attribution.retained import retained_holders
from harness._attribution.snapshot import live_tensors

pytestmark = pytest.mark.usefixtures("heap_frozen")


class Refuses:
    """An object that answers no question about itself."""

    def __getattribute__(self, name):
        raise RuntimeError(f"refused: {name}")


class Unsized(list):
    def __len__(self):
        raise RuntimeError("no length")


class Classless:
    @property
    def __class__(self):
        raise RuntimeError("no class")


class Gone:
    pass


def refusing() -> list:
    """Objects that raise when asked their class, attributes, length or storage."""
    gone = Gone()
    proxy = weakref.proxy(gone)
    del gone
    return [
        Refuses(),
        Unsized([torch.ones(4)]),
        Classless(),
        proxy,
        torch.nn.LazyLinear(4),
        torch.nn.parameter.UninitializedBuffer(),
    ]


def test_a_search_under_a_trace_or_profile_function_runs_where_neither_is_set():
    seen = []
    tools = []

    def search():
        seen.append((sys.gettrace(), sys.getprofile(), threading.get_ident()))
        return "found"

    def tool(frame, event, arg):
        return None

    quiet = unobserved(search)
    assert quiet() == "found" and seen[-1][2] == threading.get_ident()
    for install in (sys.settrace, sys.setprofile):
        install(tool)
        try:
            tools.append(watched())
            assert quiet() == "found"
        finally:
            install(None)
        assert seen[-1][:2] == (None, None) and seen[-1][2] != threading.get_ident()
    assert tools == [True, True]


def test_a_search_started_under_a_tracer_hands_its_error_to_the_caller():
    def search():
        raise KeyError("inside")

    sys.setprofile(lambda *args: None)
    try:
        with pytest.raises(KeyError, match="inside"):
            unobserved(search)()
    finally:
        sys.setprofile(None)


def test_a_traced_search_records_no_call_of_its_own():
    calls = []

    def tracer(frame, event, arg):
        calls.append(frame.f_code.co_filename)
        return None

    before = live_tensors()
    kept = [torch.ones(1024) for _ in range(4)]
    sys.settrace(tracer)
    try:
        found = attribute(before)
    finally:
        sys.settrace(None)
    assert found[0].path.endswith(":kept") and found[0].items == 4
    searched = [c for c in calls if c.endswith(("walk.py", "holders.py", "graph.py"))]
    assert searched == []
    del kept


def test_a_profiler_with_stacks_records_no_call_of_a_search():
    from torch.profiler import ProfilerActivity, profile

    before = live_tensors()
    kept = [torch.ones(1024) for _ in range(4)]
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        assert watched()
        found = attribute(before, max_objects=50_000)
    names = {e.name for e in prof.events()}
    assert not any("walk.py" in n or "holders.py" in n for n in names)
    assert found and found[0].items == 4
    del kept


def leaky_phase(attribution: PhaseAttribution, batches: int = 4) -> list:
    recorder = Recorder(attribute=attribution)
    kept = []
    try:
        with recorder.phase("validation"):
            for batch in range(batches):
                kept.append(torch.ones(64 * 1024))
                recorder.checkpoint("VALIDATION_BATCH", batch=batch)
    finally:
        recorder.close()
    return kept


def test_under_a_users_tracemalloc_a_search_steps_aside_and_says_so_once():
    assert memory_tracer() is None
    attribution = PhaseAttribution(growth=1)
    tracemalloc.start()
    try:
        assert memory_tracer() == "tracemalloc traces this process"
        kept = leaky_phase(attribution)
        assert tracemalloc.is_tracing()  # the user's traces were never stopped
    finally:
        tracemalloc.stop()
    assert attribution.searches == 0
    assert [h.path for h in attribution.holders] == [
        "<not searched: tracemalloc traces this process>"
    ]
    del kept


def test_under_a_users_memray_a_search_steps_aside(tmp_path):
    memray = pytest.importorskip("memray")
    attribution = PhaseAttribution(growth=1)
    with memray.Tracker(tmp_path / "capture.bin"):
        assert memory_tracer() == "memray tracks this process"
        kept = leaky_phase(attribution)
    assert memory_tracer() is None
    assert attribution.searches == 0
    assert [h.path for h in attribution.holders] == ["<not searched: memray tracks this process>"]
    del kept


def test_a_run_of_many_phases_searches_at_most_its_cap(monkeypatch):
    monkeypatch.setattr(phase, "SEARCHES", 3)
    attribution = PhaseAttribution(growth=1)
    recorder = Recorder(attribute=attribution)
    kept = []
    try:
        for epoch in range(phase.SEARCHES):  # each phase alone would search twice or more
            with recorder.phase("validation", epoch=epoch):
                for batch in range(3):
                    kept.append(torch.ones(64 * 1024))
                    recorder.checkpoint("VALIDATION_BATCH", batch=batch)
    finally:
        recorder.close()
    assert attribution.searches == phase.SEARCHES
    capped = [h for h in attribution.holders if h.path.startswith("<not searched")]
    assert [h.path for h in capped] == ["<not searched: 3 searches already (their cap)>"]
    del kept


def test_a_walk_stops_at_its_own_memory_cap(monkeypatch):
    monkeypatch.setattr(walk, "WALK_MAX_BYTES", 2**20)
    before = live_tensors()
    kept = [torch.ones(256) for _ in range(4)]
    found = attribute(before)
    [loose] = [h for h in found if h.path == "<not searched>"]
    assert "1.0MiB of its own memory" in loose.note
    del kept


def test_objects_that_refuse_inspection_are_skipped_silently(recwarn):
    strange = refusing()
    attribution = PhaseAttribution(growth=1, at_end=True)
    kept = leaky_phase(attribution)
    assert not [w for w in recwarn if "attribution" in str(w.message)]
    assert attribution.holders[-1].path.endswith(":kept")
    assert retained_holders(None, 200_000) is not None
    del strange, kept


def test_a_search_never_runs_an_objects_own_code():
    before = live_tensors(objects=True)
    spy = mock.MagicMock()  # answers every question, __sizeof__ too, with a new mock
    kept = [spy, torch.ones(256)]
    retained_holders(before, 200_000)
    attribute(before)
    assert spy.mock_calls == []
    del kept

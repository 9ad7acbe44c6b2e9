"""Attribution over a run: only tensors a phase created are named for its growth, a finding
says how much of its growth the named holders hold, and a phase is attributed while its loop
still holds what it kept (growth past a budget, an out-of-memory note, no START needed)."""

import functools
import gc

import pytest
import torch

from harness import Recorder
from harness._attribution.findings import Share, explain, shares
from harness._attribution.holders import Holder, attribute
from harness._attribution.phase import PhaseAttribution
from harness._attribution.snapshot import live_tensors
from harness._measure.sample import Sample


def floats(n: int) -> torch.Tensor:
    """A float32 tensor of ``4 * n`` bytes."""
    return torch.ones(n)


class Cache:
    def __init__(self) -> None:
        self._items: list[torch.Tensor] = []


class Table:
    """Rows made once and cached for good, on a method."""

    @functools.cache  # noqa: B019 (the cache outliving a test is the point)
    def rows(self, n: int) -> torch.Tensor:
        return floats(n)


TABLE = Table()


def finding(kind: str, phase: str, nbytes: int | None = None, epoch: int | None = None):
    return type("Finding", (), {"kind": kind, "phase": phase, "bytes": nbytes, "epoch": epoch})()


pytestmark = pytest.mark.usefixtures("heap_frozen")


@pytest.fixture
def table():
    yield TABLE
    Table.rows.cache_clear()


# -- never a bystander ----------------------------------------------------------------------------


def leak_in_validation(rec: Recorder, cache: Cache) -> None:
    with rec.phase("validation"):
        for batch in range(3):
            cache._items.append(floats(1024))
            rec.checkpoint("VALIDATION_BATCH", batch=batch)


def test_a_cache_filled_before_the_recorder_started_is_not_named_for_a_later_leak(table):
    gc.unfreeze()  # the recorder's own freeze marks its start (a freeze of the process's stands)
    table.rows(50_000)  # an earlier test's
    cache = Cache()
    with Recorder("cpu", attribute=PhaseAttribution(at_end=False)) as rec:
        leak_in_validation(rec, cache)
        named = explain(rec.holders, [finding("leak", "validation")])
    assert [(h.path, h.bytes) for h in named] == [("Cache._items", 3 * 4096)]


def test_a_cache_filled_in_an_earlier_phase_is_not_named_for_this_phases_leak(table):
    cache = Cache()
    with Recorder("cpu", attribute=PhaseAttribution(at_end=False)) as rec:
        with rec.phase("training"):
            table.rows(50_000)
        leak_in_validation(rec, cache)
        named = explain(rec.attribution, [finding("leak", "validation")])
    # what is new since the warm-up ended (at the first batch: no warm-up): the leak rule's base
    assert [(h.path, h.bytes) for h in named] == [("Cache._items", 2 * 4096)]


@pytest.mark.parametrize("at_end", [True, False], ids=["at the end", "when explained"])
def test_what_a_warm_up_made_once_is_not_named_for_the_leak_after_it(table, at_end):
    cache = Cache()
    with Recorder("cpu", attribute=PhaseAttribution(at_end=at_end, warmup=2)) as rec:
        with rec.phase("validation"):
            for batch in range(6):
                if batch == 0:
                    table.rows(50_000)  # made once, in the warm-up, and kept for good
                if batch >= 2:
                    cache._items.append(floats(1024))
                rec.checkpoint("VALIDATION_BATCH", batch=batch)
        named = explain(rec.attribution, [finding("leak", "validation")])
    assert [h.path for h in named] == ["Cache._items"]


class Store:
    def __init__(self) -> None:
        self.table = floats(10_000)


def test_a_new_tensor_over_storage_alive_at_the_start_is_not_growth():
    store = Store()
    before = live_tensors()
    # A new tensor over the same memory; the one the snapshot saw is gone.
    store.table = store.table.detach()
    cache = Cache()
    cache._items.append(floats(256))
    assert [(h.path, h.bytes) for h in attribute(before)] == [("Cache._items", 1024)]
    del store, cache


# -- share ----------------------------------------------------------------------------------------

MiB = 2**20


def test_a_share_says_how_much_of_the_growth_its_holders_hold():
    held = [
        Holder("Cache.items", "list", 9, 9, int(20.8 * MiB), phase="validation", label="END"),
        Holder("Trainer.log", "list", 9, 9, 1 * MiB, phase="validation", label="END"),
        Holder("Adam.state", "defaultdict", 4, 8, 5 * MiB, phase="training", label="END"),
    ]
    [share] = shares(held, [finding("leak", "validation", 23 * MiB)])
    assert share.text == str(share) == "held: 21.8 of 23.0 MiB"
    assert share.held == int(21.8 * MiB) and share.fraction == pytest.approx(21.8 / 23, 1e-3)
    assert [h.path for h in share.holders] == ["Cache.items", "Trainer.log"]
    [low] = shares(held, [finding("leak", "validation", 100 * MiB)])
    assert low.text == "held: 21.8 of 100.0 MiB (22%: most of it has no named holder)"
    assert str(Share("teardown", "session", None, None, 3 * 2**10)) == "held: 3.0 KiB"


def test_a_share_counts_one_checkpoints_holders_not_the_same_memory_twice():
    held = [
        Holder("run:outputs", "list", 4, 4, 4 * MiB, phase="val", label="VAL_BATCH"),
        Holder("Cache.items", "list", 8, 8, 8 * MiB, phase="val", label="val END"),
        Holder("Cache.items", "list", 4, 4, 4 * MiB, phase="val", label="VAL_BATCH"),
    ]
    [share] = shares(held, [finding("leak", "val", 10 * MiB)])
    assert share.held == 8 * MiB
    # Named from the one search that holds the most: the other's holders are not mixed in.
    assert [(h.path, h.bytes) for h in share.holders] == [("Cache.items", 8 * MiB)]


def grow(rec: Recorder, cache: Cache, hidden: list[bytearray], extra: int) -> int:
    """A validation phase keeping 256 KiB of tensors a batch, and ``extra`` bytes a batch of
    memory no tensor owns; its growth in ``allocated``."""
    with rec.phase("validation"):
        for batch in range(4):
            cache._items.append(floats(2**16))
            if extra:
                hidden.append(bytearray(extra))
            rec.checkpoint("VALIDATION_BATCH", batch=batch)
    start, end = rec.samples[-6], rec.samples[-1]
    return end.get("allocated") - start.get("allocated")


@pytest.mark.parametrize(("extra", "low", "high"), [(0, 0.9, 1.1), (3 * 2**18, 0.15, 0.5)])
def test_a_measured_share_tells_growth_with_a_holder_from_growth_without(extra, low, high):
    cache, hidden = Cache(), []
    with Recorder("cpu", attribute=True) as rec:
        if rec.probe.primary != "allocated":
            pytest.skip("needs malloc's own count (glibc mallinfo2)")
        growth = grow(rec, cache, hidden, extra)
        [share] = shares(rec.attribution, [finding("leak", "validation", growth)])
    assert [h.path for h in share.holders] == ["Cache._items"]
    assert low < share.fraction < high
    assert ("no named holder" in share.text) == (share.fraction < 0.5)


# -- attribute while alive ------------------------------------------------------------------------


def keep_in_a_loop(rec: Recorder, batches: int) -> None:
    outputs = []
    for batch in range(batches):
        outputs.append(floats(2**15))  # 128 KiB a batch, dropped when the loop returns
        rec.checkpoint("VALIDATION_BATCH", phase="validation", batch=batch)


def test_growth_in_a_phase_without_a_start_is_named_while_the_loop_holds_it():
    with Recorder("cpu", attribute=PhaseAttribution(growth="256KiB", at_end=False)) as rec:
        keep_in_a_loop(rec, 8)
    assert rec.holders
    for holder in rec.holders:
        assert (holder.path, holder.label, holder.phase) == (
            "keep_in_a_loop:outputs",
            "VALIDATION_BATCH",
            "validation",
        )
        # Growth is counted from the phase's first checkpoint: its tensor is not new.
        assert 2 <= holder.tensors < 8


def sample(label: str, batch: int | None = None, note: str | None = None, **metrics: int):
    event = "OOM" if note == OVER else None  # as the recorder marks a capacity exceeded
    return Sample(label, "validation", 0, batch, metrics=metrics, note=note, event=event)


OVER = "emulated capacity 1.0MiB exceeded at 'VALIDATION_BATCH': 1.2MiB on cpu"


def validate(attribution: PhaseAttribution, reserved: int = 0, over_at: int | None = None) -> None:
    """Three batches kept in a local; ``reserved`` grows by that much a batch; the checkpoints
    from batch ``over_at`` on carry an emulated out-of-memory note."""
    outputs = []
    attribution.observe(sample("validation START", allocated=0, reserved=0))
    for batch in range(5):
        if batch < 3:
            outputs.append(floats(1024))
        note = OVER if over_at is not None and batch >= over_at else None
        attribution.observe(
            sample("VALIDATION_BATCH", batch, note, allocated=0, reserved=batch * reserved)
        )


def test_an_out_of_memory_note_names_the_loop_local_once_per_phase():
    attribution = PhaseAttribution(at_end=False)
    validate(attribution, over_at=3)
    assert [(h.path, h.tensors, h.label) for h in attribution.holders] == [
        ("validate:outputs", 3, "VALIDATION_BATCH")
    ]


def test_growth_is_measured_on_the_metric_asked_for():
    on_reserved = PhaseAttribution(growth=1000, at_end=False, metric="reserved")
    validate(on_reserved, reserved=800)
    assert [(h.path, h.label) for h in on_reserved.holders] == [
        ("validate:outputs", "VALIDATION_BATCH")
    ]
    on_allocated = PhaseAttribution(growth=1000, at_end=False)
    validate(on_allocated, reserved=800)
    assert on_allocated.holders == []


# -- what a phase pays for ------------------------------------------------------------------------


@pytest.mark.parametrize("leak", [0, 256 << 10])
def test_every_object_is_counted_only_once_a_phase_has_grown(monkeypatch, leak):
    """The census of every object alive (module globals included: tens of milliseconds) that a
    search by retained size counts from is taken once the phase has grown ``CENSUS_FROM``
    past its base, at most once; a phase that does not grow never pays for it, and one that
    does still has what holds its growth named past its budget."""
    from harness._attribution import phase as phase_module

    censuses = []
    real = phase_module.live_tensors

    def counted(objects=False):
        censuses.append(objects)
        return real(objects)

    monkeypatch.setattr(phase_module, "live_tensors", counted)
    cache = Cache()
    attribution = PhaseAttribution(growth="1MiB")
    with Recorder("cpu", attribute=attribution) as rec, rec.phase("validation"):
        for batch in range(24):
            if leak:
                cache._items.append([bytearray(1024) for _ in range(leak >> 10)])
            rec.checkpoint("VALIDATION_BATCH", batch=batch)
    assert censuses.count(True) == (1 if leak else 0)
    named = [h for h in attribution.holders if "_items" in h.path]
    assert bool(named) == bool(leak)


def test_growth_past_the_budget_at_once_is_searched_by_objects_from_the_next_naming():
    """A phase that grows from nothing past its budget between two readings has no census to
    count objects from yet: that reading names the tensors' holders with one search, no
    search by retained size that could find nothing; the census taken there serves the next
    naming, which names the list the objects went to."""
    cache = Cache()
    attribution = PhaseAttribution(growth="1MiB")
    with Recorder("cpu", attribute=attribution) as rec, rec.phase("validation"):
        for batch in range(8):
            if batch >= 4:
                cache._items.append([bytearray(1024) for _ in range(2048)])
            before = attribution.searches
            rec.checkpoint("VALIDATION_BATCH", batch=batch)
            if batch == 4:
                assert attribution.searches == before + 1
    assert any("_items" in h.path for h in attribution.holders)

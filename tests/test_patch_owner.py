"""What leakgate changes in torch and in the process (the DataLoader worker loop, its fetchers and
pid hooks, the at-fork hooks' effect, ``gc.freeze()``) has one owner: it is put when the first
recorder needs it and put back, exactly as it was, when the last one closes, in either order,
and when a constructor raises halfway."""

from __future__ import annotations

import gc
import os

import pytest
import torch
from torch.utils.data import DataLoader
from torch.utils.data._utils import fetch, signal_handling, worker
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

import harness._attribution.phase
from harness._core.errors import LeakgateError
from harness._measure import heap_board
from harness._measure.patches import Patch, Patches
from harness._recorder import Recorder
from harness._verdict.options import Rules


def torch_functions() -> tuple[object, ...]:
    """Every function of torch's that leakgate may replace, as it is now."""
    return (
        worker._worker_loop,
        signal_handling._set_worker_pids,
        signal_handling._remove_worker_pids,
        _MultiProcessingDataLoaderIter.__dict__["__init__"],
        *(kind.__dict__.get("fetch") for kind in fetch._BaseDatasetFetcher.__subclasses__()),
    )


@pytest.fixture
def untouched():
    """Torch's functions, the freeze count and the forks counted before the test, which it
    must leave as they were."""
    assert gc.get_freeze_count() == 0
    return torch_functions(), heap_board.forks()


def forked_child_publishes() -> bool:
    """Whether a child forked now opens a slot on the heap board (the at-fork hook acts)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        os.write(write, b"1" if heap_board._slot is not None else b"0")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.close(read)
    os.waitpid(pid, 0)
    return answer == b"1"


def test_closing_puts_back_torch_the_freeze_and_the_fork_hooks(untouched):
    functions, forks = untouched
    with Recorder("cpu"):
        assert torch_functions() != functions and gc.get_freeze_count() > 0
        assert forked_child_publishes()  # the board's at-fork hook acts while a recorder is open
        forked = heap_board.forks()
        assert forked > forks
    assert torch_functions() == functions and gc.get_freeze_count() == 0
    assert not forked_child_publishes()
    assert heap_board.forks() == forked  # a fork after the close is nothing to leakgate


def test_a_recorder_with_workers_puts_everything_back(untouched):
    functions, _ = untouched
    with Recorder("cpu") as rec:
        loader = DataLoader(torch.arange(8.0), batch_size=2, num_workers=1)
        for batch, _ in enumerate(loader):
            rec.checkpoint("VALIDATION_BATCH", batch=batch)
    assert rec.samples[-1].processes is not None  # the worker was read
    assert torch_functions() == functions and gc.get_freeze_count() == 0


def _bogus_probe(tmp_path, monkeypatch):
    return {"probe": "bogus"}


def _unwritable_timeline(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    return {"probe": "cpu", "timeline": tmp_path / "file" / "t.jsonl"}


def _attribution_that_fails(tmp_path, monkeypatch):
    def start(self):
        raise RuntimeError("cannot start")

    monkeypatch.setattr(harness._attribution.phase.PhaseAttribution, "start", start)
    return {"probe": "cpu", "attribute": True}


@pytest.mark.parametrize(
    "failing",
    [_bogus_probe, _unwritable_timeline, _attribution_that_fails],
    ids=["unknown probe", "unwritable timeline", "attribution that fails"],
)
def test_a_constructor_that_raises_leaves_everything_as_it_was(
    untouched, failing, tmp_path, monkeypatch
):
    functions, forks = untouched
    with pytest.raises((LeakgateError, OSError, RuntimeError)):
        Recorder(**failing(tmp_path, monkeypatch))
    assert torch_functions() == functions
    assert worker._worker_loop is functions[0]
    assert gc.get_freeze_count() == 0
    assert not forked_child_publishes() and heap_board.forks() == forks


def frozen(thing: object) -> bool:
    """Whether ``thing`` is frozen: tracked by gc, in no generation it collects."""
    return gc.is_tracked(thing) and all(o is not thing for o in gc.get_objects())


def test_what_the_user_froze_stays_frozen_and_no_more(untouched):
    functions, _ = untouched
    mine = []
    gc.freeze()
    try:
        count = gc.get_freeze_count()
        made_since = []
        with Recorder("cpu"), Recorder("cpu"):
            assert not frozen(made_since)
        assert frozen(mine) and not frozen(made_since)
        assert gc.get_freeze_count() <= count  # nothing more (a frozen object may have died)
        assert torch_functions() == functions
    finally:
        gc.unfreeze()


def test_a_freeze_of_the_users_while_recording_is_left_to_them(untouched):
    rec = Recorder("cpu")
    mine = []
    gc.freeze()  # the user's: it holds everything alive now
    try:
        rec.close()
        assert frozen(mine)
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("first_closed", ["first", "second"])
def test_two_recorders_open_at_once_closed_in_either_order(untouched, first_closed):
    functions, _ = untouched
    first, second = Recorder("cpu"), Recorder("cpu")
    patched = torch_functions()
    assert patched != functions
    (first if first_closed == "first" else second).close()
    assert torch_functions() == patched and gc.get_freeze_count() > 0  # one is still open
    (second if first_closed == "first" else first).close()
    assert torch_functions() == functions and gc.get_freeze_count() == 0


def watching(budget: str) -> Recorder:
    """A recorder whose DataLoader workers search their own heap past ``budget``."""
    return Recorder("cpu", attribute=True, rules=Rules(max_child_growth=budget))


@pytest.mark.parametrize("first_closed", ["first", "second"])
def test_each_recorders_worker_hook_lasts_while_it_is_open(untouched, first_closed):
    functions, _ = untouched
    first, second = watching("1MiB"), watching("2MiB")
    assert worker._worker_loop.args[1].budget == 2 << 20  # the newest's
    if first_closed == "first":
        first.close()
        assert worker._worker_loop.args[1].budget == 2 << 20
        second.close()
    else:
        second.close()
        assert worker._worker_loop.args[1].budget == 1 << 20  # the one before acts again
        first.close()
    assert torch_functions() == functions


class Marked(Patch):
    """A patch that notes when it is put and taken back (and raises when told)."""

    def __init__(self, name: str, log: list[str], fails: bool = False) -> None:
        self.name, self.log, self.fails = name, log, fails

    def put(self) -> str | None:
        if self.fails:
            raise RuntimeError(self.name)
        self.log.append(f"put {self.name}")
        return f"{self.name} in part"

    def take_back(self) -> None:
        self.log.append(f"back {self.name}")


def test_the_owner_puts_at_the_first_holder_and_takes_back_after_the_last():
    log: list[str] = []
    owner = Patches()
    a, b = Marked("a", log), Marked("b", log)
    first = owner.hold(a, b)
    second = owner.hold(a)
    assert first.notes == ["a in part", "b in part"] and second.notes == ["a in part"]
    first.on_release(lambda: log.append("first's own"))
    first.release()
    first.release()  # once only
    assert log == ["put a", "put b", "first's own", "back b"] and owner.held(a)
    second.release()
    assert log[-1] == "back a" and not owner.held(a) and owner.holds() == []
    del log[:]
    with pytest.raises(RuntimeError, match="c"):  # halfway: what was put is taken back
        owner.hold(a, Marked("c", log, fails=True), b)
    assert log == ["put a", "back a"] and not owner.held(a) and owner.holds() == []

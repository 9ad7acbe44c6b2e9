"""harness._measure.heap_board: children publish their live heap into slots their parent reads; the
board is private, removed with its process, and what a child cannot publish is said."""

from __future__ import annotations

import multiprocessing
import os
import struct
import subprocess
import sys
import time
from multiprocessing.connection import Connection

import pytest

from harness._measure import heap_board, malloc
from harness._measure.heap_board import Board
from harness._measure.patches import PATCHES
from harness._recorder import Recorder
from harness._rules.judging import judge
from harness._verdict.options import Rules

pytestmark = pytest.mark.skipif(
    malloc.live_heap() is None or not os.path.exists("/proc/self/status"),
    reason="needs glibc's mallinfo2 and Linux /proc",
)
FORK = multiprocessing.get_context("fork")
ITEM = 64 << 10


def serve(pipe: Connection, leak: bool) -> None:
    """A forked child: each message makes a 64 KiB buffer, kept with ``leak``, then replies."""
    kept = []
    while pipe.recv():
        item = bytearray(b"\1" * ITEM)
        if leak:
            kept.append(item)
        del item
        pipe.send(True)


def fresh(board: Board, pid: int, since: int) -> int:
    """Until ``pid`` has published a reading after its ``since``-th: its count then."""
    while (reading := board.read(pid)) is None or reading.count <= since:
        time.sleep(0.001)
    return reading.count


@pytest.mark.parametrize("leak", [True, False], ids=["leaking", "clean"])
def test_a_forked_child_is_judged_on_the_heap_it_publishes(leak):
    rules = Rules(phase="validation", max_growth="4MB", warmup=5)
    ours, theirs = FORK.Pipe()
    with Recorder("cpu", rules=rules) as rec:
        board = heap_board.board()  # the one this process's children publish into
        child = FORK.Process(target=serve, args=(theirs, leak))
        child.start()
        try:
            with rec.phase("validation", epoch=0):
                count = 0
                for batch in range(120):
                    ours.send(True)
                    ours.recv()
                    count = fresh(board, child.pid, count)  # a reading after this batch
                    rec.checkpoint("VALIDATION_BATCH", batch=batch)
        finally:
            ours.send(False)
            child.join()
    verdict = judge(rec.samples, rules)
    checks = [c for c in verdict.checks if c.rule == "max_child_growth"]
    (check,) = [c for c in checks if not c.scope.endswith("(outside)")]
    assert check.details.startswith("live heap")
    (outside,) = [c for c in checks if c is not check]
    assert outside.details.startswith("anon outside what leakgate reads")
    if leak:
        assert verdict.status == "FAIL"
        assert f" {child.pid} +" in verdict.findings[0].message
        assert 6 << 20 < verdict.findings[0].bytes < 8 << 20  # 114 buffers after warm-up
    else:
        assert verdict.passed, verdict.findings
        assert abs(check.measured) < 64 << 10


def test_a_reading_being_written_gives_the_one_before(tmp_path):
    board = Board(str(tmp_path))
    pid = os.getpid()
    slot = heap_board._Slot(board.path)
    slot.publish()
    first = board.read(pid)
    assert first is not None and first.count == 1 and first.heap > 0
    with open(tmp_path / str(pid), "r+b") as raw:  # a writer stopped halfway: odd sequence
        (sequence,) = struct.unpack("<Q", raw.read(8))
        raw.seek(0)
        raw.write(struct.pack("<Q", sequence + 1))
    assert board.read(pid) == first
    slot.publish()
    assert board.read(pid).count == 2  # the next complete reading is read again
    assert board.read(pid + 1) is None  # no slot
    board.forget(pid)
    assert not (tmp_path / str(pid)).exists() and board.read(pid) is None


def test_a_child_reads_its_own_rollup_at_8_32_128_and_on():
    assert [n for n in range(1, 600) if heap_board._rolls(n)] == [8, 32, 128, 512]


LIVE = """
import os, sys
from harness._measure import heap_board
from harness._measure.patches import PATCHES
hold = PATCHES.hold(heap_board.WORKERS)
assert not hold.notes, hold.notes
print(heap_board.board().path, flush=True)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), 9)
"""


@pytest.mark.parametrize("end", ["exit", "kill"])
def test_a_board_goes_with_its_process(end):
    """Removed at exit; a board left by a killed process is removed by the next one made."""
    done = subprocess.run(
        [sys.executable, "-c", LIVE, end], capture_output=True, text=True, check=False
    )
    path = done.stdout.strip()
    assert path and os.path.basename(path).startswith("leakgate-heap-")
    if end == "kill":
        assert os.path.isdir(path)
        Board.make().close()
    assert not os.path.exists(path)


def test_what_cannot_publish_is_said(monkeypatch):
    from torch.utils.data._utils import worker

    monkeypatch.setattr(heap_board, "_board", None)
    unread = malloc.Heap("unknown", None, "no mallinfo2 (it needs glibc >= 2.33)")
    monkeypatch.setattr(heap_board, "heap", lambda: unread)
    with PATCHES.hold(heap_board.WORKERS) as hold:
        assert heap_board.board() is None
        assert hold.notes == ["children read from outside: no mallinfo2 (it needs glibc >= 2.33)"]
    monkeypatch.undo()
    monkeypatch.delattr(worker, "_worker_loop")
    with PATCHES.hold(heap_board.WORKERS) as hold:
        assert heap_board.board() is not None
        why = "spawned DataLoader workers read from outside: this torch has no _worker_loop"
        assert hold.notes == [why]


def test_the_worker_entry_point_is_pickled_by_reference():
    import pickle

    from torch.utils.data._utils import worker

    PATCHES.hold(heap_board.WORKERS)
    loop = pickle.loads(pickle.dumps(worker._worker_loop))
    assert loop.func is heap_board._worker_loop and loop.args == worker._worker_loop.args

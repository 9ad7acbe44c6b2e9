"""The heap board on odd ground never crashes nor hangs what it measures: a full file system, a
slot cut short while it is read, a FIFO at a slot's path, an odd entry beside the boards."""

import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import harness._measure.board_folder as board_folder
import harness._measure.heap_board as heap_board

ROOT = Path(__file__).resolve().parents[1]


def run(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter (a hang fails the test at the timeout, a fault shows in
    the exit status)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


LOADERS = """
import torch
from torch.utils.data import DataLoader, Dataset


class Items(Dataset):
    # each item made anew, and with keep kept in the worker that made it

    def __init__(self, keep, count, size):
        self.keep, self.count, self.size, self.kept = keep, count, size, []

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        item = torch.ones(self.size)
        if self.keep:
            self.kept.append(item)
        return item.sum()


def validate(memtrace, items, context):
    loader = DataLoader(items, batch_size=2, num_workers=2, multiprocessing_context=context)
    with memtrace.phase("validation", epoch=0):
        for batch, _ in enumerate(loader):
            memtrace.checkpoint("VALIDATION_BATCH", batch=batch)
"""
"""A DataLoader over items kept in its workers, and a validation loop over it (``loaders.py``
of the pytester runs below)."""


def worker_leak_fails_and_its_twin_passes(pytester: pytest.Pytester, tests: str) -> None:
    """``tests`` (a ``test_loader`` per ``keep``) run through the plugin in a fresh process: the
    kept items fail as a child-leak of a worker, the twin passes."""
    pytester.makepyfile(loaders=LOADERS, test_loaders=tests)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "--memreport=reports")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*FAIL*test_loader?True*", "*child-leak*worker*"])


def test_a_full_file_system_leaves_a_child_read_from_outside(monkeypatch, tmp_path):
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    assert heap_board._open(str(tmp_path)) is None
    assert list(tmp_path.iterdir()) == []  # no slot left half made


def test_a_slot_cut_short_while_it_is_read_faults_nothing(tmp_path):
    done = run(
        f"""
        import os
        import harness._measure.heap_board as hb
        board = hb.Board({str(tmp_path)!r})
        slot = hb._Slot(board.path)
        slot.publish()
        assert board.read(slot.pid) is not None
        os.truncate(os.path.join(board.path, str(slot.pid)), 0)
        slot.publish()
        print("read", board.read(slot.pid) is not None)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "read True"  # the last complete reading stays


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_at_a_slot_path_is_never_waited_on(tmp_path):
    done = run(
        f"""
        import os
        import harness._measure.heap_board as hb
        board = hb.Board({str(tmp_path)!r})
        os.mkfifo(os.path.join(board.path, "4242"))
        print("read", board.read(4242))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "read None"


def test_an_odd_entry_beside_the_boards_breaks_no_test(pytester):
    parent = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else None
    if parent is None:
        pytest.skip("no writable /dev/shm: boards are made in the temporary folder")
    odd = parent / "leakgate-heap-99999999999999999999-x"
    odd.mkdir(exist_ok=True)
    try:
        pytester.makepyfile(
            """
            import pytest
            import torch


            @pytest.mark.memleak(phase="validation", max_growth="4MB")
            def test_loop(memtrace):
                with memtrace.phase("validation", epoch=0):
                    for batch in range(40):
                        torch.ones(100).sum()
                        memtrace.checkpoint("VALIDATION_BATCH", batch=batch)
            """
        )
        result = pytester.runpytest_subprocess("-p", "no:randomly", "--memreport=reports")
        result.assert_outcomes(passed=1)
        assert odd.is_dir()  # not a board of ours: left as it was
    finally:
        odd.rmdir()


def test_a_tool_that_wraps_the_worker_loop_after_leakgate_runs_its_workers(pytester):
    """Another tool wraps torch's worker loop after leakgate put its own there: each worker
    runs through both once (no recursion), and a leak in the workers is still judged."""
    worker_leak_fails_and_its_twin_passes(
        pytester,
        """
        import functools
        import os

        import pytest
        from torch.utils.data._utils import worker

        from loaders import Items, validate


        def wrapped(loop, marks):
            @functools.wraps(loop)
            def tool(*args, **kwargs):
                os.write(marks, b"x")
                return loop(*args, **kwargs)

            return tool


        @pytest.mark.parametrize("keep", [False, True])
        @pytest.mark.memleak(phase="validation", max_growth="2MB", warmup=5)
        def test_loader(memtrace, keep, tmp_path):
            before = worker._worker_loop
            marks = os.open(tmp_path / "marks", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            worker._worker_loop = wrapped(before, marks)
            try:
                validate(memtrace, Items(keep, 120, 16_384), "fork")
            finally:
                worker._worker_loop = before
                os.close(marks)
            assert (tmp_path / "marks").read_bytes() == b"xx"  # each worker, once
        """,
    )


def test_a_board_whose_owner_lives_elsewhere_is_never_removed(tmp_path):
    """A board made in another pid namespace sharing this /dev/shm: its pid means nothing here,
    but its owner holds its lease, so the cleanup leaves it; once the lease is let go, it goes."""
    board = tmp_path / f"leakgate-heap-{2**22 + 1}-x"  # past any pid here
    board.mkdir()
    hold = (
        "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, str(board)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        board_folder.remove_orphans(str(tmp_path))
        assert board.is_dir()
    finally:
        holder.stdin.close()
        holder.wait()
    board_folder.remove_orphans(str(tmp_path))
    assert not board.exists()


def test_forkserver_workers_are_judged(pytester):
    """DataLoader workers started by multiprocessing's fork server inherit its command line:
    they are the job's workers, judged like forked ones, not the server that is left out."""
    worker_leak_fails_and_its_twin_passes(
        pytester,
        """
        import pytest

        from loaders import Items, validate


        @pytest.mark.parametrize("keep", [False, True])
        @pytest.mark.memleak(phase="validation", max_growth="4MB", warmup=5)
        def test_loader(memtrace, keep):
            validate(memtrace, Items(keep, 160, 40_000), "forkserver")  # 160 KB items
        """,
    )

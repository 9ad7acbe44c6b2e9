"""``run_ranks`` never hangs and leaves nothing behind: more local ranks than the machine can run
and a body that cannot reach a spawned rank are refused before anything starts; a rank that
raises or dies ends the run at once, naming it; its temporary folder goes after a timeout, and
after a kill its ranks die with it and the next run removes what was left.

Nothing here waits on a clock: a rank that must stay blocks on an event nobody sets, and a test
reads the lines a killed run's ranks print before it kills it.
"""

import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
import torch

from harness._core.errors import BadArgument
from harness._frontends.spawn import max_local_ranks, run_ranks
from harness._recorder import Recorder
from harness._verdict.options import Rules

ROOT = Path(__file__).resolve().parents[1]
RULES = Rules(phase="validation", max_growth="40KiB", warmup=5)
BOUND = 120.0
"""The run's ``timeout``: a safety net that a test passing never reaches."""


@pytest.fixture
def temporary(tmp_path, monkeypatch) -> Path:
    """A temporary folder of this test's own for ``run_ranks``' working folders."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("leakgate-ranks-*"))


def block_forever() -> None:
    """Wait on an event nobody sets (a signal still ends the wait)."""
    threading.Event().wait()


def loop(recorder: Recorder, batches: int = 12) -> None:
    with recorder.phase("validation", epoch=0):
        for b in range(batches):
            recorder.checkpoint("BATCH", batch=b)


# -- refused before anything starts --------------------------------------------------------------


def test_more_local_ranks_than_the_machine_can_run_are_refused_naming_the_bound(temporary):
    bound = max_local_ranks()
    assert bound >= 2
    for nproc in (bound + 1, 1_000_000):
        with pytest.raises(BadArgument, match=rf"at most {bound} local ranks") as raised:
            run_ranks(loop, nproc, rules=RULES, name="many")
        assert "\n" not in str(raised.value) and f"{nproc} ranks" in str(raised.value)
    assert leftovers(temporary) == []


def nested_body() -> object:
    def body(recorder: Recorder) -> None:
        loop(recorder)

    return body


@pytest.mark.parametrize("body", [lambda recorder: None, nested_body()], ids=["lambda", "nested"])
def test_a_body_that_is_not_a_module_level_function_is_refused_in_one_line(temporary, body):
    with pytest.raises(BadArgument, match="the body must be a module-level function") as raised:
        run_ranks(body, 2, rules=RULES, name="body")
    assert "\n" not in str(raised.value)
    assert leftovers(temporary) == []


def test_arguments_that_cannot_reach_a_rank_are_refused_in_one_line(temporary):
    with pytest.raises(BadArgument, match="args: cannot be sent to a spawned rank") as raised:
        run_ranks(loop, 2, rules=RULES, name="args", args=(lambda: 0,))
    assert "\n" not in str(raised.value)
    assert leftovers(temporary) == []


@pytest.mark.parametrize(
    ("option", "value"), [("threads", 0), ("threads", 1.5), ("timeout", 0), ("timeout", "1")]
)
def test_a_bad_thread_count_or_timeout_is_refused(temporary, option, value):
    with pytest.raises(BadArgument, match=option):
        run_ranks(loop, 2, rules=RULES, name="opts", **{option: value})
    assert leftovers(temporary) == []


# -- a rank that raises or dies ends the run at once -------------------------------------------


def raise_while_rank_0_waits(recorder: Recorder) -> None:
    """Rank 1 raises; rank 0 waits in a collective that rank 1 never joins."""
    torch.distributed.barrier()
    if torch.distributed.get_rank() == 1:
        raise ValueError("bad shard")
    loop(recorder, 6)
    torch.distributed.barrier()


def die_while_rank_0_computes(recorder: Recorder) -> None:
    """Rank 1 dies without a word; rank 0 waits on an event, not in a collective."""
    torch.distributed.barrier()
    if torch.distributed.get_rank() == 1:
        os._exit(3)
    loop(recorder, 6)
    block_forever()


@pytest.mark.parametrize(
    ("body", "error", "rank_0"),
    [
        (raise_while_rank_0_waits, "rank 1 raised ValueError: bad shard", "rank 0: "),
        (die_while_rank_0_computes, "rank 1 exited with code 3", "rank 0: stopped"),
    ],
    ids=["raised", "died"],
)
def test_a_failed_rank_ends_the_run_at_once_naming_it(temporary, tmp_path, body, error, rank_0):
    """Rank 0 is stopped (or its collective fails as rank 1 goes) and ends its own timeline:
    the merged run names rank 1 first, then what each rank's own verdict says."""
    finished = run_ranks(body, 2, rules=RULES, name="fails", directory=tmp_path, timeout=BOUND)
    verdict = finished.verdict
    shown = "\n".join(finished.lines())
    assert verdict.status == "ERROR", shown
    assert verdict.error is not None and verdict.error.startswith(error), shown
    assert "did not finish" not in verdict.error, shown
    ranks = finished.run.header["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and ranks[0]["status"] == "ERROR", shown
    assert f"; {rank_0}" in verdict.error, shown
    assert leftovers(temporary) == []


# -- temporary folders ---------------------------------------------------------------------------


def hang(recorder: Recorder) -> None:
    loop(recorder, 6)
    block_forever()


def test_a_run_past_its_timeout_stops_its_ranks_and_leaves_no_folder(temporary):
    finished = run_ranks(hang, 2, rules=RULES, name="hangs", timeout=5)
    verdict = finished.verdict
    assert verdict.status == "ERROR"
    assert verdict.error is not None and verdict.error.startswith(
        "the ranks did not finish within 5 s"
    )
    assert leftovers(temporary) == []


KILLED = """
import sys
sys.path.insert(0, {tests!r})
from test_ranks_reliability import announce_and_hang, RULES
from harness._frontends.spawn import run_ranks

if __name__ == "__main__":
    run_ranks(announce_and_hang, 2, rules=RULES, name="killed")
"""


def announce_and_hang(recorder: Recorder) -> None:
    """Say this rank's pid on stdout once it records, in one write (the ranks share the pipe),
    then hang."""
    loop(recorder, 6)
    os.write(1, f"rank {torch.distributed.get_rank()} pid {os.getpid()}\n".encode())
    block_forever()


def wait_exit(pid: int) -> bool:
    """Whether process ``pid`` (not a child of ours) has exited, waiting on its pidfd; False
    when it is still alive after :data:`BOUND` seconds."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], BOUND)[0])
    finally:
        os.close(fd)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_run_takes_its_ranks_with_it_and_the_next_run_removes_its_folder(
    temporary, tmp_path, sig
):
    script = tmp_path / "killed.py"
    script.write_text(KILLED.format(tests=str(ROOT / "tests")))
    env = {**os.environ, "TMPDIR": str(temporary), "PYTHONPATH": str(ROOT)}
    errors = tmp_path / "stderr"
    with errors.open("w") as stderr:
        command = [sys.executable, str(script)]
        run = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, cwd=tmp_path
        )
    assert run.stdout is not None
    said = [run.stdout.readline() for _ in range(2)]
    assert all(line.startswith("rank ") for line in said), errors.read_text()[-3000:]
    pids = [int(line.split()[-1]) for line in said]
    assert len(leftovers(temporary)) == 1
    run.send_signal(sig)
    run.wait(BOUND)
    run.stdout.close()
    assert all(wait_exit(pid) for pid in pids), "a rank outlived the run that started it"
    assert run_ranks(loop, 2, rules=RULES, name="next").verdict.passed
    assert leftovers(temporary) == []

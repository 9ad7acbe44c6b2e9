"""``python -m harness._frontends.selfcheck`` on odd ground: inside a launcher's rank variables,
with a stdout that takes nothing, under a tracemalloc started outside leakgate."""

import os
import signal
import socket
import subprocess
import sys
import tempfile

import pytest

HANG = 180  # seconds: a guard against a hang only (a healthy selfcheck takes seconds)


def selfcheck(*args, env=None, stdout=subprocess.PIPE):
    """``python -m harness._frontends.selfcheck`` (or ``python -c CODE`` with ``-c``) in a
    subprocess, in a folder of its own (the harness imported is the installed one). Past
    :data:`HANG` its whole process group is killed (a training command it runs included) and the
    test fails."""
    command = [sys.executable, *(args or ("-m", "harness._frontends.selfcheck"))]
    with subprocess.Popen(
        command,
        env={**os.environ, **(env or {})},
        cwd=tempfile.gettempdir(),
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            out, err = process.communicate(timeout=HANG)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            pytest.fail(f"the selfcheck did not end within {HANG} s")
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_selfcheck_is_one_process_whatever_rank_variables_it_inherits():
    ranks = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1"}
    done = selfcheck(env={**ranks, "MASTER_PORT": str(free_port())})
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[2].startswith("ok     cpu: the incident replayed: exit 1, FAIL")
    assert lines[-1] == "selfcheck: ok (3 checks)"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_stdout_is_one_line_on_stderr_and_a_non_zero_exit():
    with open("/dev/full", "w") as full:
        done = selfcheck(stdout=full)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "selfcheck: cannot write to stdout: No space left on device"
    ]


TRACED = """
import sys
import tracemalloc

from harness._frontends import selfcheck

every = selfcheck.cpu_checks
selfcheck.cpu_checks = lambda: [c for c in every() if "incident" not in c.name]
tracemalloc.start(25)
sys.exit(selfcheck.selfcheck([]))
"""


def test_under_a_tracemalloc_started_outside_the_holder_check_says_why_it_stepped_aside():
    # PYTHONTRACEMALLOC=25's tracing, started once torch is imported (traced, its import takes
    # a minute), without the incident replay (whose training command would run traced too)
    done = selfcheck("-c", TRACED)
    assert done.returncode == 0, done.stdout + done.stderr
    holder = done.stdout.splitlines()[1]
    assert holder.startswith("ok     cpu: a leak and its clean twin, the holder: leak FAIL")
    assert "holder not searched: tracemalloc traces this process" in holder

"""A test body on N local ranks, judged as one distributed run: :func:`run_ranks`.

Each rank is a process spawned with ``multiprocessing`` that joins a gloo process group on
127.0.0.1 (through a store on a free port), records into its own recorder (ready to name
holders, as a single run's is), and finishes through
:func:`~harness._results.merge.finish_distributed`; the merged result decides the test.

What can go wrong is bounded, and said in one line:

- before anything starts, a world size this machine cannot run (:func:`max_local_ranks`), a
  body that is not a module-level function and arguments that cannot reach a spawned rank are
  refused (:class:`~harness._core.errors.BadArgument`);
- a rank that raises ends its own timeline and exits; one that dies just exits. Either ends the
  run at once: the other ranks are stopped (``SIGTERM``: each ends its timeline, saying it was
  stopped; ``SIGKILL`` after :data:`KILL_AFTER` seconds), and the ranks' timelines are merged into a
  verdict that is ERROR and names the rank that failed first. ``timeout`` stops a run the same
  way;
- the working folder (``leakgate-ranks-<pid>-*`` in the temporary folder) is leased while its
  run lives and removed when it ends; a run killed outright takes its ranks with it (each dies
  with its parent), and the next run removes its folder.
"""

from __future__ import annotations

import ctypes
import math
import multiprocessing
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType
from typing import Any

import harness._core.labels as labels
from harness._core.errors import BadArgument, Raised, refused_as_argument
from harness._core.naming import check_file_name, check_path, safe_name
from harness._frontends.local_ranks import check_local_ranks
from harness._frontends.local_ranks import max_local_ranks as max_local_ranks  # re-exported
from harness._measure.board_folder import leased_folder
from harness._measure.malloc import libc_function
from harness._results.finish import Finished
from harness._results.merge import finish_distributed, merge_timelines, rank_part
from harness._verdict.options import Rules, check_count, check_flag

FOLDER_PREFIX = "leakgate-ranks-"
"""The working folders' prefix, in the temporary folder."""
KILL_AFTER = 10.0
"""Seconds a stopped rank has to end its timeline before it is killed."""
STOPPED = 128 + signal.SIGTERM
"""The exit code of a rank stopped by ``SIGTERM`` (as a shell reports one)."""
STOPPED_NOTE = "stopped: the run ended (another rank failed, or time ran out)"
"""What a stopped rank's timeline says it ended with."""
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class _Spec:
    """What each spawned rank needs (pickled to it)."""

    body: Callable[..., Any]
    args: tuple[Any, ...]
    nproc: int
    name: str
    rules: Rules | None
    directory: str | None
    probe: str
    threads: int
    attribute: bool
    timeout: float
    title: str | None
    parent: int
    port: int = 0
    timelines: str = ""
    exchange: str = ""


def run_ranks(
    body: Callable[..., Any],
    nproc: int = 2,
    *,
    name: str | None = None,
    rules: Rules | Mapping[str, Any] | None = None,
    directory: str | os.PathLike[str] | None = None,
    args: Sequence[Any] = (),
    probe: str = "cpu",
    threads: int = 1,
    attribute: bool = False,
    timeout: float = 300.0,
    title: str | None = None,
) -> Finished:
    """Run ``body(recorder, *args)`` on ``nproc`` local ranks and judge them as one run.

    Each rank is a process spawned with ``multiprocessing`` that joins a gloo process group on
    127.0.0.1 (through a store on a port the system picks), records into its own
    :class:`~harness._recorder.Recorder` (``probe``, ``rules``; ``threads`` torch threads), framed
    by collected ``TEST_START``/``TEST_END`` checkpoints, and finishes through
    :func:`finish_distributed`. Each rank names the holders of its own growth as a single run
    does (where it passes ``max_growth``; at every phase's end too with ``attribute``).
    ``body`` must be a module-level function; ``torch.distributed.get_rank()`` tells it its
    rank. Timelines and the merged report go to ``directory`` (default: inside a pytest test run
    with ``--memreport``, its folder, where ``leakgate gate`` sees them; else the working
    folder, removed after). ``name`` defaults to the running pytest test's.

    Refused before anything starts (:class:`~harness._core.errors.BadArgument`, one line): every
    argument of the wrong type or value, an ``nproc`` more than this machine can run
    (:func:`max_local_ranks`), a body that is not a module-level function, ``args`` that cannot
    be pickled.

    Returns the merged :class:`~harness._results.finish.Finished`. A rank that raised or exited
    early, or a run past ``timeout`` seconds, stops the other ranks at once and makes it ERROR,
    naming the rank (see the module).
    """
    check_local_ranks(nproc)
    # Each argument is checked in the order of its keyword here.
    spec = _Spec(
        nproc=nproc,
        name=_test_name() if name is None else check_file_name(name),
        rules=rules if rules is None or isinstance(rules, Rules) else Rules.from_dict(rules),
        directory=_folder(directory),
        args=_arguments(args),
        probe=_probe(probe),
        threads=check_count(threads, where="threads", least=1),
        attribute=check_flag(attribute, where="attribute"),
        timeout=_seconds(timeout, "timeout"),
        title=_title(title),
        body=_body(body),
        parent=os.getpid(),
    )
    _check_sendable(spec)
    return _run(spec)


def _folder(directory: str | os.PathLike[str] | None) -> str | None:
    """Where the timelines and the report go: ``directory``, checked, else the ``--memreport``
    folder of the pytest run this is in, else None (the working folder)."""
    if directory is not None:
        check_path(directory, "directory", folder=True)
    folder = directory if directory is not None else _memreport()
    return str(folder) if folder is not None else None


def _arguments(args: Any) -> tuple[Any, ...]:
    """The body's arguments: a sequence (not text), as a tuple."""
    if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
        raise BadArgument(f"args: expected a sequence of arguments, got {type(args).__name__}")
    return tuple(args)


def _probe(probe: str) -> str:
    """A probe's name the recorder knows."""
    from harness._measure.probes import probe_type

    with refused_as_argument():
        probe_type(probe)
    return probe


def _title(title: Any) -> str | None:
    """The report's title: text, or None for the test's."""
    if title is not None and not isinstance(title, str):
        raise BadArgument(f"title: expected text or None, got {type(title).__name__}")
    return title


def _check_sendable(spec: _Spec) -> None:
    """``spec`` pickles, as every spawned rank receives it."""
    try:
        pickle.dumps(spec)
    except Exception as exc:
        raise BadArgument(f"args: cannot be sent to a spawned rank ({Raised.of(exc)})") from None


def _run(given: _Spec) -> Finished:
    """Spawn the ranks in a leased working folder, watch them, and merge what they left."""
    import torch.distributed as dist

    exchange, lease = leased_folder(FOLDER_PREFIX, tempfile.gettempdir())
    store = None
    try:
        store = dist.TCPStore(
            "127.0.0.1", 0, None, True, timedelta(seconds=given.timeout), wait_for_workers=False
        )
        timelines = given.directory if given.directory is not None else exchange
        spec = replace(given, port=store.port, timelines=timelines, exchange=exchange)
        payload = pickle.dumps(spec)
        spawn = multiprocessing.get_context("spawn")
        ranks = [
            spawn.Process(target=_rank_main, args=(rank, payload), name=f"leakgate rank {rank}")
            for rank in range(spec.nproc)
        ]
        try:
            for process in ranks:
                process.start()
            failure = _watch(ranks, Path(exchange), spec.timeout)
        finally:
            _stop(ranks)
        merged = Path(exchange) / "merged.pkl"
        if failure is None and merged.exists():
            with merged.open("rb") as file:
                return pickle.load(file)  # written by our own rank 0 just now
        paths = sorted(Path(timelines).glob(f"{spec.name}.rank*.jsonl"))
        if not paths:
            raise RuntimeError(f"run_ranks: no rank left a timeline ({failure})")
        return merge_timelines(
            paths,
            spec.rules,
            name=spec.name,
            directory=spec.directory,
            title=spec.title,
            world_size=spec.nproc,
            error=failure or "rank 0 did not merge the run",
        )
    finally:
        del store
        shutil.rmtree(exchange, ignore_errors=True)
        os.close(lease)


def _watch(ranks: Sequence[BaseProcess], exchange: Path, timeout: float) -> str | None:
    """Wait for every rank to exit, or for the first to fail or the time to run out: what
    stopped the run, or None when every rank exited cleanly."""
    deadline = time.monotonic() + timeout
    waiting = {process.sentinel: rank for rank, process in enumerate(ranks)}
    while waiting:
        left = deadline - time.monotonic()
        ready = wait(list(waiting), timeout=left) if left > 0 else []
        if not ready:
            return f"the ranks did not finish within {timeout:g} s"
        failed = []
        for sentinel in ready:
            rank = waiting.pop(sentinel)  # type: ignore[arg-type]
            ranks[rank].join()
            if ranks[rank].exitcode != 0:
                failed.append(rank)
        if failed:
            return _first_failure(failed, ranks, exchange)
    return None


def _first_failure(failed: Sequence[int], ranks: Sequence[BaseProcess], exchange: Path) -> str:
    """What the first of ``failed`` (ranks seen to exit at once) did: a rank that died before
    one that raised (a collective fails on the ranks left when one dies), else the earliest to
    raise."""

    def said(rank: int) -> tuple[int, int]:
        raised = exchange / f"rank{rank}.raised"
        return (1, raised.stat().st_mtime_ns) if raised.exists() else (0, 0)

    rank = min(failed, key=said)
    raised = exchange / f"rank{rank}.raised"
    if raised.exists():
        return f"rank {rank} raised {raised.read_text().strip()}"
    return f"rank {rank} {_exit_text(ranks[rank].exitcode)}"


def _exit_text(code: int | None) -> str:
    """``exited with code 3``, ``was killed by SIGKILL``, ``was stopped by SIGTERM``."""
    if code == STOPPED:
        return "was stopped by SIGTERM"
    if code is not None and code < 0:
        known = -code in signal.valid_signals()
        return f"was killed by {signal.Signals(-code).name if known else f'signal {-code}'}"
    return f"exited with code {code}"


def _stop(ranks: Sequence[BaseProcess]) -> None:
    """Stop the ranks still running: ``SIGTERM`` (each ends its own timeline), then
    ``SIGKILL`` for those still there after :data:`KILL_AFTER` seconds."""
    running = [p for p in ranks if p.pid is not None and p.exitcode is None]
    for process in running:
        process.terminate()
    deadline = time.monotonic() + KILL_AFTER
    for process in running:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in running:
        if process.exitcode is None:
            process.kill()
            process.join()


class _Stopped(BaseException):
    """Raised in a rank's body when ``run_ranks`` stops it (another rank failed, or the run timed
    out): a ``BaseException``, so that the body's own handlers let it by."""


class _StopSignal:
    """A rank's ``SIGTERM`` handler: raises :class:`_Stopped` while the body runs (armed), and
    only notes it after, when the rank is ending its own timeline."""

    def __init__(self) -> None:
        self.armed = False
        self.asked = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.asked = True
        if self.armed:
            self.armed = False
            raise _Stopped(STOPPED_NOTE)


def _rank_main(rank: int, payload: bytes) -> None:
    """One spawned rank: join the group, record the body, finish with the other ranks, and
    leave with an exit code that says how it went."""
    stop = _StopSignal()
    signal.signal(signal.SIGTERM, stop)
    spec: _Spec = pickle.loads(payload)
    _die_with_parent(spec.parent)
    try:
        code = _run_rank(rank, spec, stop)
    except _Stopped:
        code = STOPPED
    except BaseException as exc:  # the group or the recorder could not start
        _say_raised(spec, rank, exc)
        code = 1
    # Done, and everything written: leave before the interpreter's C++ teardown, where a rank
    # of torch 2.13 sometimes aborts ("terminate called without an active exception"; rank 0
    # of a two-rank test exited with -6 in 1 of 4 full test runs) and a finished rank would
    # count as a failed one.
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def _run_rank(rank: int, spec: _Spec, stop: _StopSignal) -> int:
    """The rank's run; its exit code: 0 when it finished (merged or not: a peer that died is
    the run's failure, not this rank's), 1 when the body raised, :data:`STOPPED` when stopped."""
    import torch
    import torch.distributed as dist

    from harness._attribution.phase import PhaseAttribution
    from harness._recorder import Recorder

    torch.set_num_threads(spec.threads)
    quiet_flight_recorder()
    store = dist.TCPStore("127.0.0.1", spec.port, None, False, timedelta(seconds=spec.timeout))
    dist.init_process_group(
        "gloo",
        store=store,
        rank=rank,
        world_size=spec.nproc,
        timeout=timedelta(seconds=spec.timeout),
    )
    # Ready to name holders where a rank's growth passes its budget, as the plugin's recorder is.
    attribution = True if spec.attribute else PhaseAttribution.for_rules(spec.rules or Rules())
    recorder = Recorder(
        spec.probe,
        timeline=Path(spec.timelines) / f"{spec.name}.jsonl",
        rules=spec.rules,
        attribute=attribution,
        meta={"test": spec.name},
    )
    with recorder:
        recorder.checkpoint(labels.TEST_START, phase="test", collect=True)
        error: BaseException | None = None
        try:
            try:  # a stop raises in the body, or here before its end: never after
                stop.armed = True
                if stop.asked:
                    raise _Stopped("stopped before the body started")
                spec.body(recorder, *spec.args)
            finally:
                stop.armed = False
        except (Exception, _Stopped) as exc:
            error = exc.with_traceback(None)
        said = None if error is None else f"raised {type(error).__name__}"
        if isinstance(error, _Stopped) or (error is None and stop.asked):
            said = STOPPED_NOTE
        recorder.checkpoint(labels.TEST_END, phase="test", collect=True, note=said)
        if said == STOPPED_NOTE:
            rank_part(recorder, spec.rules, name=spec.name, error=said)
            return STOPPED
        if error is not None:
            rank_part(recorder, spec.rules, name=spec.name, error=error)
            _say_raised(spec, rank, error)
            return 1
        try:
            finished = finish_distributed(
                recorder, spec.rules, name=spec.name, directory=spec.directory, title=spec.title
            )
        except RuntimeError:  # a peer left: this rank's timeline is ended, the run merges it
            return 0
    if rank == 0:
        path = Path(spec.exchange) / "merged.pkl"
        temporary = path.with_name(".merged.pkl")
        temporary.write_bytes(pickle.dumps(finished))
        os.replace(temporary, path)
    dist.destroy_process_group()
    return 0


def _say_raised(spec: _Spec, rank: int, error: BaseException) -> None:
    """Leave what ``rank`` raised for the parent, in one line (``ValueError: bad shard``)."""
    text = str(Raised.of(error)).replace("\n", " ")
    path = Path(spec.exchange) / f"rank{rank}.raised"
    try:
        path.with_name(f".rank{rank}.raised").write_text(text + "\n")
        os.replace(path.with_name(f".rank{rank}.raised"), path)
    except OSError:  # the run is over and its folder gone: nobody is left to tell
        pass


def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this rank when the process that spawned it dies (Linux), so that a
    run killed outright leaves no rank waiting in a collective (where no signal handler runs)."""
    prctl = libc_function("prctl", ctypes.c_int, ctypes.c_int, ctypes.c_ulong)
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before that took hold
        os._exit(STOPPED)


def _body(body: Any) -> Callable[..., Any]:
    """``body`` when a spawned rank can import it by name: a module-level function (or other
    callable that pickles by reference). ``BadArgument`` in one line otherwise."""
    qualname = getattr(body, "__qualname__", None)
    try:
        if not callable(body) or (qualname is not None and "<" in qualname):
            raise TypeError
        pickle.dumps(body)
    except Exception:
        shown = qualname or type(body).__name__
        raise BadArgument(
            f"body: the body must be a module-level function, importable by a spawned rank "
            f"(got {shown})"
        ) from None
    return body


def _seconds(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise BadArgument(f"{what}: expected a positive number of seconds, got {value!r}")
    return float(value)


def quiet_flight_recorder() -> None:
    """Turn off c10d's flight recorder for process groups made after this call, unless its size
    is set (``TORCH_FR_BUFFER_SIZE`` or ``TORCH_NCCL_TRACE_BUFFER_SIZE``). By default it keeps
    the last 2000 collectives with their stacks, about 1 KB each (measured with gloo): a run's
    first 2000 collectives grow memory by about 2 MB, which a leak rule cannot tell from a
    leak."""
    if (
        "TORCH_FR_BUFFER_SIZE" not in os.environ
        and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in os.environ
    ):
        os.environ["TORCH_FR_BUFFER_SIZE"] = "0"


def _test_name() -> str:
    """The running pytest test as a file name, else ``ranks``."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    return safe_name(current) if current else "ranks"


def _memreport() -> str | None:
    """Inside a pytest test run with ``--memreport``, that folder (the plugin puts it in the
    environment); else None."""
    if "PYTEST_CURRENT_TEST" not in os.environ:
        return None
    from harness._frontends.plugin import MEMREPORT_ENV

    return os.environ.get(MEMREPORT_ENV) or None

"""A test body on N local ranks, judged as one distributed run: :func:`run_ranks`.

Each rank is a process spawned with ``torch.multiprocessing`` that joins a gloo process group on
127.0.0.1 (through a store on a free port), records into its own recorder, and finishes through
:func:`~harness.results.merge.finish_distributed`; the merged result decides the test.
"""

from __future__ import annotations

import os
import pickle
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import harness.core.labels as labels
from harness.core.identity import check_world_size
from harness.core.naming import check_file_name, safe_name
from harness.results.finish import Finished
from harness.results.merge import finish_distributed, merge_timelines
from harness.verdict.options import Rules


@dataclass(frozen=True)
class _Spec:
    """What each spawned rank needs (pickled to it)."""

    body: Callable[..., Any]
    args: tuple[Any, ...]
    nproc: int
    port: int
    name: str
    rules: Rules | None
    timelines: str
    directory: str | None
    exchange: str
    probe: str
    threads: int
    attribute: bool
    timeout: float
    title: str | None


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

    Each rank is a process spawned with ``torch.multiprocessing`` that joins a gloo process
    group on 127.0.0.1 (through a store on a port the system picks), records into its own
    :class:`~harness.recorder.Recorder` (``probe``, ``rules``, ``attribute``; ``threads``
    torch threads), framed by collected ``TEST_START``/``TEST_END`` checkpoints, and finishes
    through :func:`finish_distributed`. ``body`` must be importable by name (a module-level
    function); ``torch.distributed.get_rank()`` tells it its rank. Timelines and the merged
    report go to ``directory`` (default: inside a pytest test run with ``--memreport``, its
    folder, where ``leakgate gate`` sees them; else a temporary folder, removed after). ``name``
    defaults to the running pytest test's. A ``name`` that is not a plain file name and an
    ``nproc`` that is not a world size are refused (``ValueError``; ``TypeError`` for one of
    the wrong type) before anything starts.

    Returns the merged :class:`~harness.results.finish.Finished`; a rank that raised or exited
    early, or a run past ``timeout`` seconds (a safety net against a hung collective), makes it
    ERROR.
    """
    import torch.distributed as dist
    import torch.multiprocessing as mp

    check_world_size(nproc)
    name = _test_name() if name is None else check_file_name(name)
    if rules is not None and not isinstance(rules, Rules):
        rules = Rules.from_dict(rules)
    directory = directory if directory is not None else _memreport()
    exchange = tempfile.mkdtemp(prefix="leakgate-ranks-")
    timelines = str(directory) if directory is not None else exchange
    store = dist.TCPStore(
        "127.0.0.1", 0, None, True, timedelta(seconds=timeout), wait_for_workers=False
    )
    spec = _Spec(
        body,
        tuple(args),
        nproc,
        store.port,
        name,
        rules,
        timelines,
        str(directory) if directory is not None else None,
        exchange,
        probe,
        threads,
        attribute,
        timeout,
        title,
    )
    failure = None
    try:
        context = mp.start_processes(_rank_main, args=(spec,), nprocs=nproc, join=False)
        deadline = time.monotonic() + timeout
        try:
            while not context.join(timeout=max(0.5, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    failure = f"the ranks did not finish within {timeout:g} s"
                    for process in context.processes:
                        if process.is_alive():
                            process.terminate()
                    break
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
            failure = _rank_failure(exc)
        merged = Path(exchange) / "merged.pkl"
        if failure is None and merged.exists():
            with merged.open("rb") as file:
                return pickle.load(file)  # written by our own rank 0 just now
        paths = sorted(Path(timelines).glob(f"{name}.rank*.jsonl"))
        if not paths:
            raise RuntimeError(f"run_ranks: no rank left a timeline ({failure})")
        return merge_timelines(
            paths,
            rules,
            name=name,
            directory=directory,
            title=title,
            world_size=nproc,
            error=failure or "rank 0 did not merge the run",
        )
    finally:
        del store
        shutil.rmtree(exchange, ignore_errors=True)


def _rank_failure(exc: Exception) -> str:
    """``rank 1 raised ValueError: ...`` or ``rank 1 exited with code -9``."""
    rank = getattr(exc, "error_index", "?")
    code = getattr(exc, "exit_code", None)
    if code is not None:
        return f"rank {rank} exited with code {code}"
    lines = [t for t in str(exc).strip().splitlines() if t.strip()]
    return f"rank {rank} raised {lines[-1].strip() if lines else type(exc).__name__}"


def _rank_main(rank: int, spec: _Spec) -> None:
    """One spawned rank: join the group, record the body, finish with the other ranks."""
    import torch
    import torch.distributed as dist

    from harness.recorder import Recorder

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
    try:
        recorder = Recorder(
            spec.probe,
            timeline=Path(spec.timelines) / f"{spec.name}.jsonl",
            rules=spec.rules,
            attribute=spec.attribute,
            meta={"test": spec.name},
        )
        error: BaseException | None = None
        with recorder:
            recorder.checkpoint(labels.TEST_START, phase="test", collect=True)
            try:
                spec.body(recorder, *spec.args)
            except Exception as exc:
                error = exc.with_traceback(None)
            recorder.checkpoint(
                labels.TEST_END,
                phase="test",
                collect=True,
                note=None if error is None else f"raised {type(error).__name__}",
            )
            finished = finish_distributed(
                recorder,
                spec.rules,
                name=spec.name,
                error=error,
                directory=spec.directory,
                title=spec.title,
            )
        if rank == 0:
            path = Path(spec.exchange) / "merged.pkl"
            path.write_bytes(pickle.dumps(finished))
    finally:
        dist.destroy_process_group()
    # Done, and everything written: leave before the interpreter's C++ teardown, where a rank
    # of torch 2.13 sometimes aborts ("terminate called without an active exception"; rank 0
    # of a two-rank test exited with -6 in 1 of 4 full test runs) and a finished rank would
    # count as a failed one.
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


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
    from harness.frontends.plugin import MEMREPORT_ENV

    return os.environ.get(MEMREPORT_ENV) or None

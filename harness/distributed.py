"""Distributed runs (``torch.distributed``, DDP under ``torchrun``): one timeline per rank, judged
as one run.

- Which rank a process is: :func:`rank_info` reads an initialised default process group, else
  the ``RANK``/``LOCAL_RANK``/``WORLD_SIZE`` variables a launcher sets. A
  :class:`~harness.recorder.Recorder` writes it into its timeline header (``rank``,
  ``world_size``, ``local_rank``, ``backend``) and streams to ``<name>.rank<N>.jsonl``
  (:func:`rank_timeline`), so the ranks never share a file and need no coordination.
- Judging: every rank is judged on its own rules (:func:`rank_part`, through
  :func:`~harness.finish.finish_run`, holders named while they are alive); then the cross-rank
  rules (:mod:`harness.rules.ranks`) compare the ranks. :func:`finish_ranks` merges the parts
  into one verdict and writes one report and one verdict, ``<name>.md`` and ``<name>.json``:
  FAIL when any rank fails or one rank stands out, ERROR when a rank raised or left no
  timeline. The merged verdict's header lists each rank's run id (``header.ranks``): that is
  how ``leakgate gate`` pairs the rank timelines with it, so the run counts as one verdict.
- When: after the ranks finish. In a script, every rank calls :func:`finish_distributed`; the
  parts go to rank 0 over the process group (no shared folder needed), rank 0 merges and
  writes, and every rank gets the merged result. A run whose ranks did not all get there (one
  was killed) is merged from its files with ``python -m harness.distributed TIMELINE...``
  (:func:`merge_timelines`).
- In pytest: :func:`run_ranks` runs a test body on N local ranks (spawned with
  ``torch.multiprocessing``, gloo on 127.0.0.1 through a store on a free port), each with its
  own recorder, and returns the merged result whose verdict decides the test.
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import labels
from harness.finish import Finished, finish_run, rules_of
from harness.report.ranks import MergedRun, RankRun
from harness.rules.ranks import judge_ranks
from harness.timeline import Timeline, read_timeline
from harness.verdict import Check, CheckStatus, PhaseStats, Rules, Status, Verdict

if TYPE_CHECKING:
    from harness.recorder import Recorder

_RANK_SUFFIX = re.compile(r"[._-]rank(\d+)$")


@dataclass(frozen=True)
class RankInfo:
    """Where a process stands in a distributed run. ``backend`` is the process group's
    (``gloo``, ``nccl``), or None when the group was not initialised yet."""

    rank: int
    world_size: int
    local_rank: int | None = None
    backend: str | None = None

    def to_header(self) -> dict[str, Any]:
        """The timeline header's fields."""
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": self.local_rank,
            "backend": self.backend,
        }


def rank_info(environ: Mapping[str, str] | None = None) -> RankInfo | None:
    """This process's rank: from an initialised default process group, else from ``RANK``
    (or ``LOCAL_RANK``) and ``WORLD_SIZE``; None for a process that is not one of several.

    Raises ``ValueError`` naming the variable when one is set but is not a rank in range."""
    env = os.environ if environ is None else environ
    local = _whole(env, "LOCAL_RANK")
    try:
        import torch.distributed as dist
    except ImportError:  # a torch built without distributed support
        dist = None  # type: ignore[assignment]
    if environ is None and dist is not None and dist.is_available() and dist.is_initialized():
        return RankInfo(dist.get_rank(), dist.get_world_size(), local, str(dist.get_backend()))
    world = _whole(env, "WORLD_SIZE")
    rank = _whole(env, "RANK")
    rank = local if rank is None else rank
    if world is None or rank is None:
        return None
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"RANK/WORLD_SIZE: rank {rank} is not in a world of size {world}")
    return RankInfo(rank, world, local, None)


def _whole(env: Mapping[str, str], name: str) -> int | None:
    text = env.get(name)
    if text is None or not text.strip():
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name}: expected a whole number, got {text[:40]!r}") from None


def rank_timeline(path: str | os.PathLike[str], rank: int) -> Path:
    """``<stem>.rank<N><suffix>`` for ``path``; unchanged when its stem already names that rank
    (``run.rank1.jsonl``, ``run-rank1.jsonl``)."""
    path = Path(path)
    found = _RANK_SUFFIX.search(path.stem)
    if found is not None and int(found.group(1)) == rank:
        return path
    return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def run_name(path: str | os.PathLike[str]) -> tuple[str, int] | None:
    """``("run", 1)`` for ``.../run.rank1.jsonl``; None for a name without a rank."""
    stem = Path(path).stem
    found = re.fullmatch(r"(.+)\.rank(\d+)", stem)
    return (found.group(1), int(found.group(2))) if found else None


# -- judging ------------------------------------------------------------------------------------


def rank_part(
    record: Recorder | Timeline,
    rules: Rules | None = None,
    *,
    name: str,
    error: BaseException | str | None = None,
    timeline: str | os.PathLike[str] | None = None,
) -> RankRun:
    """Judge one rank on its own (its stored rules unless ``rules`` are given) through
    :func:`~harness.finish.finish_run`, writing nothing: its part of the merged run."""
    finished = finish_run(record, rules, name=name, error=error)
    header = finished.run.header
    rank = header.get("rank")
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise ValueError(f"{name}: the timeline header names no rank")
    path = timeline if timeline is not None else getattr(record, "timeline_path", None)
    return RankRun(
        rank=rank,
        header=dict(header),
        samples=list(finished.run.samples),
        verdict=finished.verdict,
        holders=list(finished.run.holders),
        shares=tuple(finished.shares),
        torn=finished.run.torn,
        timeline=str(path) if path is not None else None,
    )


def merge_verdicts(parts: Sequence[RankRun], rules: Rules, world_size: int) -> Verdict:
    """One verdict for the ranks: each rank's findings and checks (named by rank), the
    cross-rank rules' findings and checks, each phase's statistics from its worst rank.

    ERROR when a rank raised or is missing; else FAIL when any finding blocks; else ERROR when
    a rank judged nothing it was asked to; else PASS."""
    findings, checks = [], []
    for part in parts:
        findings += [
            replace(f, message=f"rank {part.rank}: {f.message}") for f in part.verdict.findings
        ]
        checks += [replace(c, scope=f"rank {part.rank} · {c.scope}") for c in part.verdict.checks]
    across, across_checks = judge_ranks({p.rank: p.verdict for p in parts}, rules)
    findings += across
    checks += across_checks
    missing = sorted(set(range(world_size)) - {p.rank for p in parts})
    errors = [f"rank {p.rank}: {p.verdict.error}" for p in parts if p.verdict.error]
    raised = [
        p for p in parts if any(c.rule == "error" and c.status == "ERROR" for c in p.verdict.checks)
    ]
    if missing:
        text = f"rank {', '.join(map(str, missing))} of {world_size} left no timeline"
        checks.append(Check("ranks", "run", CheckStatus.ERROR, text))
        errors.insert(0, text)
    if missing or raised:
        status = Status.ERROR
    elif any(f.blocking for f in findings):
        status = Status.FAIL
    elif any(p.verdict.status == Status.ERROR for p in parts):
        status = Status.ERROR
    else:
        status = Status.PASS
    error = "; ".join(errors) if status == Status.ERROR else None
    return Verdict(status, tuple(findings), _worst_phases(parts), tuple(checks), rules, error)


def _worst_phases(parts: Sequence[RankRun]) -> tuple[PhaseStats, ...]:
    """Per ``(phase, epoch)``, the statistics of the rank that grew most (its status the worst
    of any rank's), in rank 0's order: what a baseline comparison of the run reads."""
    order = {"ERROR": 0, "FAIL": 1, "WARN": 2, "PASS": 3, "SKIP": 4}
    chosen: dict[tuple[Any, Any], PhaseStats] = {}
    worst: dict[tuple[Any, Any], str] = {}
    for part in parts:
        for stats in part.verdict.phases:
            key = (stats.phase, stats.epoch)
            kept = chosen.get(key)
            if kept is None or (stats.growth or 0) > (kept.growth or 0):
                chosen[key] = stats
            seen = worst.get(key, "SKIP")
            worst[key] = min(seen, stats.status, key=lambda s: order.get(s, 5))
    return tuple(replace(stats, status=worst[key]) for key, stats in chosen.items())


def finish_ranks(
    parts: Sequence[RankRun],
    rules: Rules | None = None,
    *,
    name: str,
    directory: str | os.PathLike[str] | None = None,
    title: str | None = None,
    world_size: int | None = None,
    error: str | None = None,
) -> Finished:
    """Merge the ranks' parts into one run and write ``directory/<name>.md`` and ``.json``
    (nothing without ``directory``). ``rules`` (default: rank 0's stored rules) drive the
    cross-rank rules; ``world_size`` defaults to the headers'. ``error`` is what stopped the
    run as a whole (a rank that exited), added to the verdict as ERROR. A failed write is
    returned as ``write_error``, as :func:`~harness.finish.finish_run` does."""
    if not parts:
        raise ValueError("finish_ranks: no rank to merge")
    parts = sorted(parts, key=lambda p: p.rank)
    if len({p.rank for p in parts}) != len(parts):
        raise ValueError("finish_ranks: a rank appears twice")
    first = parts[0]
    if rules is None:
        rules = rules_of(first.header)
    world = world_size or max(
        [p.rank + 1 for p in parts]
        + [w for p in parts if isinstance(w := p.header.get("world_size"), int)]
    )
    verdict = merge_verdicts(parts, rules, world)
    if error is not None:
        verdict = replace(
            verdict,
            status=Status.ERROR,
            error="; ".join(e for e in (error, verdict.error) if e),
            checks=(*verdict.checks, Check("ranks", "run", CheckStatus.ERROR, error)),
        )
    folder = Path(directory) if directory is not None else None
    markdown = folder / f"{name}.md" if folder is not None else None
    document = folder / f"{name}.json" if folder is not None else None
    here = folder or Path(".")
    parts = [replace(p, timeline=_relative(p.timeline, here)) for p in parts]
    header = dict(first.header)
    for key in ("rank", "local_rank", "pid"):
        header.pop(key, None)
    header.update(
        run_id=uuid.uuid4().hex,
        world_size=world,
        ranks=[
            {
                "rank": p.rank,
                "run_id": p.run_id,
                "status": str(p.verdict.status),
                "timeline": p.timeline,
                "host": p.header.get("host"),
                "pid": p.header.get("pid"),
            }
            for p in parts
        ],
    )
    holders = [
        {**h, "rank": p.rank, "path": f"rank {p.rank}: {h.get('path')}"}
        for p in parts
        for h in p.holders
    ]
    test = header.get("meta", {}).get("test") if isinstance(header.get("meta"), Mapping) else None
    run = MergedRun(
        name=name,
        header=header,
        samples=list(first.samples),
        verdict=verdict,
        title=title or (test if isinstance(test, str) else None),
        holders=holders,
        torn=sum(p.torn for p in parts),
        timeline=None,
        verdict_file=document.name if document is not None else None,
        ranks=tuple(parts),
    )
    from harness.attribution import Holder

    found = sorted((Holder.from_dict(h) for h in holders), key=lambda h: -h.bytes)
    shares = [
        replace(
            share, holders=tuple(replace(h, path=f"rank {p.rank}: {h.path}") for h in share.holders)
        )
        for p in parts
        for share in p.shares
    ]
    if folder is None:
        return Finished(run, found, shares)
    from harness.artifacts import write_run

    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_run(run, markdown, document)
    except OSError as exc:
        return Finished(run, found, shares, write_error=exc)
    assert markdown is not None and document is not None
    return Finished(run, found, shares, {"md": markdown, "json": document})


def _relative(path: str | None, here: Path) -> str | None:
    if path is None:
        return None
    try:
        return os.path.relpath(path, here)
    except ValueError:
        return path


def finish_distributed(
    recorder: Recorder,
    rules: Rules | None = None,
    *,
    name: str,
    error: BaseException | str | None = None,
    directory: str | os.PathLike[str] | None = None,
    title: str | None = None,
) -> Finished:
    """The finishing step of a distributed run, called by every rank after its run: each rank
    is judged on its own, rank 0 gathers the parts over the default process group, merges them
    and writes ``directory/<name>.md`` and ``.json``, and every rank returns the merged result.

    Without an initialised process group (or with one rank) this is
    :func:`~harness.finish.finish_run` for the one process. On NCCL, set the rank's CUDA device
    first (``torch.cuda.set_device``): the parts travel as CUDA tensors there."""
    import torch.distributed as dist

    if "rank" not in recorder.header:
        return finish_run(recorder, rules, name=name, error=error, directory=directory, title=title)
    part = rank_part(recorder, rules, name=name, error=error)
    grouped = dist.is_available() and dist.is_initialized()
    if not grouped and recorder.header.get("world_size") != 1:
        raise RuntimeError(
            "finish_distributed: no process group to send the ranks' parts to rank 0; "
            "initialise one, or merge the rank timelines afterwards with "
            "python -m harness.distributed"
        )
    if not grouped or dist.get_world_size() == 1:
        return finish_ranks([part], rules, name=name, directory=directory, title=title)
    rank, world = dist.get_rank(), dist.get_world_size()
    gathered: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(part, gathered, dst=0)
    box: list[Any] = [None]
    if rank == 0:
        assert gathered is not None
        box[0] = finish_ranks(
            [p for p in gathered if p is not None],
            rules,
            name=name,
            directory=directory,
            title=title,
            world_size=world,
        )
    dist.broadcast_object_list(box, src=0)
    return box[0]


def merge_timelines(
    paths: Sequence[str | os.PathLike[str]],
    rules: Rules | None = None,
    *,
    name: str | None = None,
    directory: str | os.PathLike[str] | None = None,
    title: str | None = None,
    world_size: int | None = None,
    error: str | None = None,
) -> Finished:
    """Merge rank timelines read back from disk (a run whose ranks could not merge themselves:
    one was killed). ``name`` defaults to the timelines' common name (``run`` for
    ``run.rank0.jsonl``), ``directory`` to their folder. ``ValueError``/``OSError`` for a file
    that is not a rank timeline."""
    parts = []
    names = set()
    for path in paths:
        timeline = read_timeline(path)
        stem = run_name(path)
        names.add(stem[0] if stem else Path(path).stem)
        parts.append(rank_part(timeline, rules, name=Path(path).stem, timeline=path))
    if name is None:
        if len(names) != 1:
            raise ValueError(f"the timelines are of several runs ({', '.join(sorted(names))})")
        name = names.pop()
    if directory is None:
        directory = Path(paths[0]).parent
    return finish_ranks(
        parts,
        rules,
        name=name,
        directory=directory,
        title=title,
        world_size=world_size,
        error=error,
    )


# -- the gate -----------------------------------------------------------------------------------


def gate_problems(
    path: Path, header: Mapping[str, Any], docs: Mapping[str, Mapping[str, Any]]
) -> list[str] | None:
    """What stops a rank timeline from counting in ``leakgate gate``, or None when ``path``
    is not one (``<name>.rank<N>.jsonl`` whose header names rank N and that has no verdict of
    its own): the merged ``<name>.json`` is missing, or it does not list this rank's run."""
    found = run_name(path)
    if found is None or path.with_suffix(".json").name in docs or header.get("rank") != found[1]:
        return None
    base, rank = found
    merged = f"{base}.json"
    doc = docs.get(merged)
    run_id = header.get("run_id")
    if doc is None:
        return [f"missing verdict: {path.name} (rank {rank}) has no merged {merged}"]
    ranks = doc.get("header", {}).get("ranks") if isinstance(doc.get("header"), Mapping) else None
    listed = {
        r.get("rank"): r.get("run_id")
        for r in (ranks if isinstance(ranks, list) else [])
        if isinstance(r, Mapping)
    }
    if listed.get(rank) != run_id:
        return [
            f"stale verdict: {merged} does not list run {run_id or 'unknown'} of {path.name} "
            f"(it lists {listed.get(rank) or 'no run'} for rank {rank})"
        ]
    return []


# -- pytest: a body on N local ranks -----------------------------------------------------------


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
    report go to ``directory`` (default: a temporary folder, removed after). ``name``
    defaults to the running pytest test's.

    Returns the merged :class:`~harness.finish.Finished`; a rank that raised or exited early, or
    a run past ``timeout`` seconds (a safety net against a hung collective), makes it ERROR.
    """
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if nproc < 1:
        raise ValueError(f"run_ranks: nproc must be at least 1, got {nproc}")
    if rules is not None and not isinstance(rules, Rules):
        rules = Rules.from_dict(rules)
    name = name or _test_name()
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
    if not current:
        return "ranks"
    from harness.plugin import safe_name

    return safe_name(current)


# -- the command line ---------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harness.distributed TIMELINE...``: merge rank timelines into one report and
    verdict (exit 0 PASS, 1 otherwise, 2 bad input)."""
    parser = argparse.ArgumentParser(
        prog="python -m harness.distributed",
        description="Merge the rank timelines of one distributed run into <name>.md and "
        "<name>.json beside them (each rank judged on its own rules, then the ranks compared).",
    )
    parser.add_argument("timelines", nargs="+", type=Path, metavar="NAME.rankN.jsonl")
    parser.add_argument("--name", help="the run's name (default: the timelines')")
    parser.add_argument("--directory", type=Path, help="where the report goes (default: theirs)")
    parser.add_argument("--world-size", type=int, help="ranks the run had (default: the headers')")
    args = parser.parse_args(argv)
    try:
        finished = merge_timelines(
            args.timelines, name=args.name, directory=args.directory, world_size=args.world_size
        )
    except (OSError, ValueError) as exc:
        text = str(exc).strip().splitlines()
        print(f"error: {text[0] if text else type(exc).__name__}", file=sys.stderr)
        return 2
    return finished.exit_code()


if __name__ == "__main__":
    sys.exit(main())

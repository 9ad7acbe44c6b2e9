"""Merging the ranks of a distributed run into one run: one verdict, one report.

- Every rank is judged on its own rules (:func:`rank_part`, through
  :func:`~harness._results.finish.finish_run`, holders named while they are alive); then the
  cross-rank rules (:mod:`harness._rules.rank_outlier`) compare the ranks. :func:`finish_ranks`
  merges the parts into one verdict (its status decided as
  :func:`~harness._rules.judging.judge` decides one)
  and writes ``<name>.md`` and ``<name>.json``: FAIL when any rank fails or one rank stands out,
  ERROR when a rank raised or left no timeline. The merged verdict's header lists each rank's run id
  (``header.ranks``): that is how ``leakgate gate`` pairs the rank timelines with it
  (:func:`gate_problems`), so the run counts as one verdict.
- In a script, every rank calls :func:`finish_distributed` after its run: the parts go to rank 0
  over the process group (no shared folder needed), rank 0 merges and writes, and every rank
  gets the merged result. A run whose ranks did not all get there (one was killed) is merged
  from its files with ``leakgate merge TIMELINE...`` (:func:`merge_timelines`).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness._core.errors import BadInput
from harness._core.fsio import make_folders, would_replace
from harness._core.identity import MAX_WORLD_SIZE, check_rank, check_world_size
from harness._core.naming import check_file_name, run_name
from harness._core.records import HolderRecord
from harness._report.ranks import MergedRun, RankRun
from harness._results.finish import Finished, finish_run, relative, rules_of, write_finished
from harness._rules.judging import decide
from harness._rules.rank_outlier import judge_ranks
from harness._timeline.jsonl import Timeline, read_timeline
from harness._verdict.model import RAISED, Check, CheckStatus, PhaseStats, Status, Verdict
from harness._verdict.options import Rules

if TYPE_CHECKING:
    from harness._attribution.holders import Holder
    from harness._recorder import Recorder


def rank_part(
    record: Recorder | Timeline,
    rules: Rules | None = None,
    *,
    name: str,
    error: BaseException | str | None = None,
    timeline: str | os.PathLike[str] | None = None,
) -> RankRun:
    """Judge one rank on its own (its stored rules unless ``rules`` are given) through
    :func:`~harness._results.finish.finish_run`, writing nothing: its part of the merged run.
    ``ValueError`` when its header names no rank of a world it could be in
    (:func:`header_rank`)."""
    path = timeline if timeline is not None else getattr(record, "timeline_path", None)
    rank = header_rank(record.header, path or name)
    finished = finish_run(record, rules, name=name, error=error)
    header, samples = finished.run.header, finished.run.samples
    return RankRun(
        rank=rank,
        header=dict(header),
        samples=samples if isinstance(record, Timeline) else list(samples),  # a recorder's grows
        verdict=finished.verdict,
        holders=list(finished.run.holders),
        shares=tuple(finished.shares),
        torn=finished.run.torn,
        timeline=str(path) if path is not None else None,
    )


def _holders(named: Sequence[Mapping[str, Any]]) -> list[Holder]:
    """The ranks' holders read back; torch is imported only where a rank named one."""
    if not named:
        return []
    from harness._attribution.holders import Holder

    return [Holder.from_dict(h) for h in named]


def header_rank(header: Mapping[str, Any], where: object) -> int:
    """The rank a timeline header names, checked against its ``world_size`` (when it has one)
    by :mod:`harness._core.identity`'s checks. ``ValueError`` starting with ``where`` otherwise."""
    world = _header_world(header, where)
    try:
        return check_rank(header.get("rank"), MAX_WORLD_SIZE if world is None else world)
    except (TypeError, ValueError) as exc:
        raise BadInput(str(exc), path=str(where), field="header") from None


def _header_world(header: Mapping[str, Any], where: object) -> int | None:
    """A header's checked ``world_size``, None when it has none."""
    world = header.get("world_size")
    try:
        return None if world is None else check_world_size(world)
    except (TypeError, ValueError) as exc:
        raise BadInput(str(exc), path=str(where), field="header") from None


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
    missing = _missing(sorted({p.rank for p in parts}), world_size)
    errors = [f"rank {p.rank}: {p.verdict.error}" for p in parts if p.verdict.error]
    raised = [
        p
        for p in parts
        if any(c.rule == RAISED and c.status == CheckStatus.ERROR for c in p.verdict.checks)
    ]
    if missing:
        text = f"rank {missing} of {world_size} left no timeline"
        checks.append(Check("ranks", "run", CheckStatus.ERROR, text))
        errors.insert(0, text)
    text = "; ".join(errors)
    status, error = decide(
        findings,
        error=text if missing or raised else None,
        unjudged=text if any(p.verdict.status == Status.ERROR for p in parts) else None,
    )
    return Verdict(status, tuple(findings), _worst_phases(parts), tuple(checks), rules, error)


def _missing(present: Sequence[int], world_size: int) -> str:
    """The ranks of ``range(world_size)`` not in ``present`` (sorted), as runs: ``1, 3-7``."""
    runs, start = [], 0
    for rank in [*present, world_size]:
        if rank > start:
            runs.append(str(start) if rank == start + 1 else f"{start}-{rank - 1}")
        start = max(start, rank + 1)
    return ", ".join(runs)


def _worst_phases(parts: Sequence[RankRun]) -> tuple[PhaseStats, ...]:
    """Per ``(phase, epoch)``, the statistics of the rank that grew most (its status the worst
    of any rank's), in rank 0's order: what a baseline comparison of the run reads."""
    chosen: dict[tuple[Any, Any], PhaseStats] = {}
    worst: dict[tuple[Any, Any], CheckStatus] = {}
    for part in parts:
        for stats in part.verdict.phases:
            key = (stats.phase, stats.epoch)
            kept = chosen.get(key)
            if kept is None or (stats.growth or 0) > (kept.growth or 0):
                chosen[key] = stats
            worst[key] = CheckStatus.worst((worst.get(key, CheckStatus.SKIP), stats.status))
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
    returned as ``write_error``, as :func:`~harness._results.finish.finish_run` does.

    ``ValueError`` for ranks that do not fit one world (headers that disagree on its size, a
    rank outside it, a ``world_size`` out of range or unlike the headers': see
    :func:`harness._core.identity.check_world_size`), and, when writing, for a ``name`` that is not
    a plain file name."""
    parts = _checked_parts(parts, name, directory)
    first = parts[0]
    if rules is None:
        rules = rules_of(first.header)
    world = _world(parts, world_size)
    verdict = _stopped(merge_verdicts(parts, rules, world), error)
    folder = Path(directory) if directory is not None else None
    parts = [replace(p, timeline=relative(p.timeline, folder or Path("."))) for p in parts]
    header = _merged_header(parts, world)
    meta = header.get("meta")
    test = meta.get("test") if isinstance(meta, Mapping) else None
    run = MergedRun(
        name=name,
        header=header,
        samples=first.samples,
        verdict=verdict,
        title=title or (test if isinstance(test, str) else None),
        holders=_rank_holders(parts),
        torn=sum(p.torn for p in parts),
        timeline=None,
        verdict_file=f"{name}.json" if folder is not None else None,
        ranks=tuple(parts),
    )
    return _write_merged(run, folder)


def _checked_parts(
    parts: Sequence[RankRun], name: str, directory: str | os.PathLike[str] | None
) -> list[RankRun]:
    """The parts in rank order: at least one, each rank once; ``name`` a plain file name when
    the run is written."""
    if not parts:
        raise BadInput("no rank to merge", field="finish_ranks")
    if directory is not None:
        check_file_name(name)
    ordered = sorted(parts, key=lambda p: p.rank)
    if len({p.rank for p in ordered}) != len(ordered):
        raise BadInput("a rank appears twice", field="finish_ranks")
    return ordered


def _stopped(verdict: Verdict, error: str | None) -> Verdict:
    """``verdict`` made ERROR by what stopped the run as a whole, when something did."""
    if error is None:
        return verdict
    return replace(
        verdict,
        status=Status.ERROR,
        error="; ".join(e for e in (error, verdict.error) if e),
        checks=(*verdict.checks, Check("ranks", "run", CheckStatus.ERROR, error)),
    )


def _merged_header(parts: Sequence[RankRun], world: int) -> dict[str, Any]:
    """Rank 0's header as the run's (no rank, local rank or pid of its own): a run id of its
    own, the world size, and each rank's run id, status, timeline, host and pid."""
    header = dict(parts[0].header)
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
    return header


def _rank_holders(parts: Sequence[RankRun]) -> list[HolderRecord]:
    """Every rank's holders, each path led by its rank."""
    return [
        {**h, "rank": p.rank, "path": f"rank {p.rank}: {h.get('path')}"}
        for p in parts
        for h in p.holders
    ]


def _write_merged(run: MergedRun, folder: Path | None) -> Finished:
    """The merged run finished: its holders and shares (each share's lines led by its rank),
    written into ``folder`` as ``<name>.md`` and ``.json`` when there is one."""
    found = sorted(_holders(run.holders), key=lambda h: -h.bytes)
    shares = [share for p in run.ranks for share in p.shares]
    ranks = tuple(p.rank for p in run.ranks for _ in p.shares)  # each share's lines lead with it
    markdown = document = None
    if folder is not None:
        try:
            make_folders(folder)
        except OSError as exc:
            return Finished(run, found, shares, write_error=exc, ranks=ranks)
        markdown, document = folder / f"{run.name}.md", folder / f"{run.name}.json"
    return replace(write_finished(run, found, shares, markdown, document), ranks=ranks)


def _world(parts: Sequence[RankRun], given: int | None) -> int:
    """The run's world size: ``given`` or the headers' (they must agree), else one past the
    highest rank; every rank must be in it. ``ValueError`` (``TypeError`` for a ``given`` of
    the wrong type) naming the mismatch."""
    if given is not None:
        check_world_size(given)
    stated: dict[int, int] = {}
    for part in parts:
        world = _header_world(part.header, f"rank {part.rank}")
        if world is not None:
            stated.setdefault(world, part.rank)
    if len(stated) > 1:
        told = ", ".join(f"rank {rank} says {world}" for world, rank in stated.items())
        raise BadInput(f"the ranks disagree on the world size ({told})")
    if given is not None and stated and given not in stated:
        raise BadInput(f"world size {given} given, the ranks' headers say {next(iter(stated))}")
    world = given or next(iter(stated), parts[-1].rank + 1)
    for part in parts:
        check_rank(part.rank, world)
    return world


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
    :func:`~harness._results.finish.finish_run` for the one process. On NCCL, set the rank's CUDA
    device first (``torch.cuda.set_device``): the parts travel as CUDA tensors there."""
    import torch.distributed as dist

    if "rank" not in recorder.header:
        return finish_run(recorder, rules, name=name, error=error, directory=directory, title=title)
    part = rank_part(recorder, rules, name=name, error=error)
    grouped = dist.is_available() and dist.is_initialized()
    if not grouped and recorder.header.get("world_size") != 1:
        raise RuntimeError(
            "finish_distributed: no process group to send the ranks' parts to rank 0; "
            "initialise one, or merge the rank timelines afterwards with "
            "leakgate merge"
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
    ``run.rank0.jsonl``), ``directory`` to their folder.

    Before anything is read: ``ValueError`` for a name that is not a plain file name
    (:func:`~harness._core.naming.check_file_name`), a ``world_size`` out of range, or a report or
    verdict that would replace one of ``paths`` (:func:`~harness._core.fsio.would_replace`). Then
    ``ValueError``/``OSError`` for a file that is not a rank timeline, and ``ValueError`` for
    ranks that do not fit one world (see :func:`finish_ranks`)."""
    if not paths:
        raise BadInput("no timeline to merge")
    if name is None:
        names = {found[0] if (found := run_name(p)) else Path(p).stem for p in paths}
        if len(names) != 1:
            raise BadInput(f"the timelines are of several runs ({', '.join(sorted(names))})")
        name = names.pop()
    check_file_name(name)
    if world_size is not None:
        check_world_size(world_size)
    folder = Path(directory) if directory is not None else Path(paths[0]).parent
    for output in (folder / f"{name}.md", folder / f"{name}.json"):
        for path in paths:
            if would_replace(output, path):
                raise BadInput(
                    f"would replace the input {path}; the merged report and verdict must go "
                    "elsewhere (another name or directory)",
                    path=output,
                )
    parts = [
        rank_part(read_timeline(path), rules, name=Path(path).stem, timeline=path) for path in paths
    ]
    return finish_ranks(
        parts,
        rules,
        name=name,
        directory=folder,
        title=title,
        world_size=world_size,
        error=error,
    )


def gate_problems(
    path: Path, header: Mapping[str, Any], docs: Mapping[str, Mapping[str, Any]]
) -> list[str] | None:
    """What stops a rank timeline from counting in ``leakgate gate``, or None when ``path``
    is not one (``<name>.rank<N>.jsonl`` whose header names rank N): the merged
    ``<name>.json`` is missing, or it does not list this rank's run. A verdict of the rank's
    own (``leakgate report`` on its timeline) never stands in for the merged one: it judged one
    rank, and only the merged verdict compares the ranks."""
    found = run_name(path)
    if found is None or header.get("rank") != found[1]:
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

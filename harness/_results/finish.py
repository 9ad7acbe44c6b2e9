"""The one finishing step every entry point takes: judge, attribute, save, summarise.

The pytest plugin, ``python -m tft.train --memreport`` and ``python -m harness report`` all
call :func:`finish_run`: with a live :class:`~harness._recorder.Recorder` (holders still alive
are named) or with a :class:`~harness._timeline.jsonl.Timeline` read back from disk (nothing
alive to name). Rules come from the caller, else from the timeline header, where the recorder wrote
them.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import harness._core.labels as labels
from harness._core.errors import BadArgument, BadInput, LeakgateError, as_unwritable
from harness._core.json_values import shown
from harness._core.naming import check_file_name, check_path
from harness._core.units import format_size
from harness._core.wording import plural
from harness._report.run import Run
from harness._results.artifacts import write_run
from harness._rules.context import scope
from harness._rules.judging import decide, judge
from harness._rules.sample_columns import Columns
from harness._timeline.jsonl import Timeline
from harness._timeline.store import NONE
from harness._verdict.model import CheckStatus, Finding, Kind, Status, Verdict
from harness._verdict.options import Rules

if TYPE_CHECKING:
    from harness._attribution.findings import Share
    from harness._attribution.holders import Holder
    from harness._recorder import Recorder


@dataclass(frozen=True)
class Finished:
    """A finished run: its verdict, the holders named for it, the files written, and the
    error that stopped them being written (the verdict stands either way)."""

    run: Run
    holders: Sequence[Holder] = ()
    shares: Sequence[Share] = ()
    paths: Mapping[str, Path] = field(default_factory=dict)
    write_error: OSError | None = None
    ranks: Sequence[int] = ()
    """A merged run's: the rank each of ``shares`` was named on, which leads its lines."""

    @property
    def verdict(self) -> Verdict:
        return self.run.verdict

    def holder_lines(self, limit: int = 3) -> list[str]:
        """Who holds the memory of each explained finding, and how much of it they hold."""
        lines = []
        for n, share in enumerate(self.shares):
            if share.holders:
                rank = f"rank {self.ranks[n]}: " if n < len(self.ranks) else ""
                lines.append(f"  {rank}{share.kind} in {share.phase or 'the run'}: {share.text}")
                lines += [
                    f"    {rank}held {f'in {h.process} ' if h.process else ''}by {h}"
                    for h in share.holders[:limit]
                ]
        return lines

    def exit_code(self) -> int:
        """Print the verdict for a command line; 0 on PASS, 1 otherwise, 2 when the report
        could not be written."""
        print("\n".join(self.lines()))
        if self.write_error is not None:
            print(f"error: {as_unwritable(self.write_error, None)}", file=sys.stderr)
            return 2
        if "md" in self.paths:
            print(f"report: {self.paths['md']}")
        return 0 if self.verdict.passed else 1

    def lines(self, *, holders: int = 3) -> list[str]:
        """The verdict for a terminal: a status line, one line per finding, the top holders."""
        verdict = self.verdict
        lines = [
            f"memory verdict: {verdict.status}" + (f" ({verdict.error})" if verdict.error else "")
        ]
        lines += [f"  [{f.severity} {f.kind}] {f.message}" for f in verdict.findings]
        lines += self.holder_lines(holders)
        return lines


def rules_of(header: Mapping[str, Any], end: Mapping[str, Any] | None = None) -> Rules:
    """The rules a timeline's run was judged by (its end record's ``rules``) or recorded under
    (``header["rules"]``, or an older timeline's ``meta.rules``); default rules when it names
    none. ``ValueError`` when they do not read."""
    stored = (end or {}).get("rules")
    if stored is None:
        stored = header.get("rules")
    if stored is None:
        meta = header.get("meta")
        stored = meta.get("rules") if isinstance(meta, Mapping) else None
    if stored is None:
        return Rules()
    if not isinstance(stored, Mapping):
        raise BadInput("not an object", field="the header's rules")
    return Rules.from_dict(stored)


class MemoryCheckFailed(LeakgateError, RuntimeError):
    """A run's memory verdict is not PASS and the caller asked for an exception (the Lightning
    callback's ``raise_on_fail=True``). ``finished`` holds the verdict, the holders named and the
    report's paths (:class:`Finished`); the message is its summary lines."""

    def __init__(self, finished: Finished) -> None:
        if not isinstance(finished, Finished):
            raise BadArgument(f"expected a finished run, got {shown(finished)}", field="finished")
        super().__init__("\n".join(finished.lines()))
        self.finished = finished

    @property
    def verdict(self) -> Verdict:
        return self.finished.verdict


def finish_run(
    record: Recorder | Timeline,
    rules: Rules | Mapping[str, Any] | None = None,
    *,
    name: str,
    error: BaseException | labels.Raised | str | None = None,
    directory: str | os.PathLike[str] | None = None,
    markdown: str | os.PathLike[str] | None = None,
    document: str | os.PathLike[str] | None = None,
    timeline: str | os.PathLike[str] | None = None,
    title: str | None = None,
) -> Finished:
    """Judge ``record`` against ``rules`` (or a mapping of their fields; default: the ones its
    header names), name the holders of what failed while they are alive (a recorder's run
    only), and write the report and the JSON verdict: to ``directory/<name>.md`` and ``.json``,
    or to ``markdown`` and ``document`` (either may be None). ``timeline`` is the timeline file
    the report links to (default: the recorder's, or ``directory/<name>.jsonl`` when it exists).
    A recorder whose timeline took another name (``<name>.<run id>.jsonl``: another live run
    held the name) saves its report and verdict under that stem, so neither run's files are
    lost. A write that fails is returned as ``write_error``, never raised: the verdict must
    still reach its caller. The recorder's timeline is such a write: its end record, or a line
    it could not write earlier (:attr:`~harness._recorder.Recorder.timeline_error`). An argument
    it cannot take is a :class:`~harness._core.errors.BadArgument`, before the run is ended."""
    rules = _checked(record, rules, name=name, error=error, directory=directory, title=title)
    markdown, document, timeline = (
        None if path is None else check_path(path, what)
        for path, what in ((markdown, "markdown"), (document, "document"), (timeline, "timeline"))
    )
    live = not isinstance(record, Timeline)
    kept: Mapping[str, Any] = {}
    header: Mapping[str, Any]
    if isinstance(record, Timeline):
        header, samples, torn = record.header, record.samples, record.torn
        error = record.error if record.end is not None else unfinished(record)
        kept = record.end or {}
    else:
        header, samples, torn = record.header, record.samples, 0
        timeline = timeline or record.timeline_path
    if rules is None:
        rules = rules_of(header, kept)
    explained: list[Share] = []
    holders: list[Holder] = []
    try:
        verdict = judge(samples, rules, error=error)
        if not isinstance(record, Timeline):
            explained = _shares(record, verdict)
            verdict, explained = _profiled(verdict, explained)
            holders = _named(explained)
        else:
            verdict = as_profilers(verdict, _profiled_phases(kept))
    finally:
        if not isinstance(record, Timeline):
            record.end(
                error,
                ending(rules, holders, explained),
            )
    if directory is not None:
        folder = Path(directory)
        if live and timeline is not None and timeline.parent == folder:
            name = timeline.stem
        markdown, document = folder / f"{name}.md", folder / f"{name}.json"
        if timeline is None and (folder / f"{name}.jsonl").exists():
            timeline = folder / f"{name}.jsonl"
    here = (markdown or document or Path(".")).parent
    run = Run(
        name=name,
        header=dict(header),
        samples=samples,
        verdict=verdict,
        title=title or _test_of(header),
        holders=[h.to_dict() for h in holders] if live else list(kept.get("holders") or ()),
        torn=torn,
        timeline=relative(timeline, here),
        verdict_file=relative(document, here),
    )
    finished = write_finished(run, holders, explained, markdown, document, timeline)
    lost = None if isinstance(record, Timeline) else record.timeline_error
    if lost is not None and finished.write_error is None:
        return replace(finished, write_error=lost)
    return finished


def _checked(
    record: object, rules: object, *, name: object, error: object, directory: Any, title: object
) -> Rules | None:
    """:func:`finish_run`'s arguments but its paths checked, and its rules as :class:`Rules`."""
    if not isinstance(record, Timeline):
        from harness._recorder import Recorder  # torch's: imported once a recorder may be given

        if not isinstance(record, Recorder):
            _refused("record", record, "a Recorder or a Timeline")
    if error is not None and not isinstance(error, (BaseException, labels.Raised, str)):
        _refused("error", error, "an exception, a Raised or text")
    for value, what in ((name, "name"), ("" if title is None else title, "title")):
        if not isinstance(value, str):
            _refused(what, value, "text")
    if directory is not None:
        check_path(directory, "directory", folder=True)
        check_file_name(name)
    if rules is None or isinstance(rules, Rules):
        return rules
    if not isinstance(rules, Mapping):
        _refused("rules", rules, "Rules or a mapping of their fields")
    return Rules.from_dict(rules)


def _refused(what: str, value: object, wanted: str) -> NoReturn:
    """Refuse ``finish_run``'s argument ``what``: a :class:`~harness._core.errors.BadArgument`."""
    raise BadArgument(f"expected {wanted}, got {shown(value)}", field=what)


def write_finished(
    run: Run,
    holders: Sequence[Holder],
    shares: Sequence[Share],
    markdown: Path | None,
    document: Path | None,
    timeline: Path | None = None,
) -> Finished:
    """``run`` finished: its report written to ``markdown`` and its JSON verdict to
    ``document`` (either may be None: nothing is written without both). A write that fails is
    returned as ``write_error``, never raised: the verdict must still reach its caller."""
    if markdown is None and document is None:
        return Finished(run, holders, shares)
    try:
        write_run(run, markdown, document)
    except OSError as exc:
        return Finished(run, holders, shares, {}, exc)
    paths = {k: p for k, p in (("md", markdown), ("json", document)) if p is not None}
    if timeline is not None:
        paths["timeline"] = timeline
    return Finished(run, holders, shares, paths)


def unfinished(timeline: Timeline) -> str | None:
    """Why a timeline without an end record is not a finished run (``None`` when it still
    reached its end checkpoint: written before end records existed)."""
    samples = timeline.samples
    columns = Columns(samples)
    if columns.where_label(labels.is_run_end).size:
        return None
    epochs = columns.epoch[columns.epoch != NONE].tolist()
    config = timeline.header.get("config")
    planned = config.get("epochs") if isinstance(config, Mapping) else None
    where = f"epoch {epochs[-1]}" if epochs else "no epoch"
    if epochs and isinstance(planned, int) and not isinstance(planned, bool):
        where += f" of {planned}"
    return f"run ended at checkpoint {len(samples)}, {where}: killed or crashed before its end"


def ending(rules: Rules, holders: Sequence[Holder], shares: Sequence[Share]) -> dict[str, Any]:
    """What a run's end record keeps so that its report can be rebuilt as it was: the rules it
    was judged by (as written), the holders named, and each finding's share as the
    attribution gave it (every field, and its text)."""
    return {
        "rules": rules.to_dict(),
        "holders": [h.to_dict() for h in holders],
        "shares": [{**dataclasses.asdict(s), "text": str(s)} for s in shares],
    }


def summary_line(verdict: Verdict) -> str:
    """``FAIL: 2 findings, worst leak +3.2MB`` for a command's last line."""
    text = f"{verdict.status}: {plural(len(verdict.findings), 'finding')}"
    worst = verdict.worst()
    if worst is not None and worst.bytes is not None:
        text += f", worst {worst.kind} {format_size(worst.bytes, signed=worst.kind != Kind.OOM)}"
    return text


def _shares(recorder: Recorder, verdict: Verdict) -> list[Share]:
    """Holders for a failing verdict's findings, searched while the run's objects live:
    against what existed when each finding's phase started, when the recorder attributed."""
    if verdict.passed:
        return []
    from harness._attribution.findings import shares

    return shares(
        recorder.attribution or recorder.holders, verdict.findings, recorder.worker_holders()
    )


def _profiled(verdict: Verdict, found: Sequence[Share]) -> tuple[Verdict, list[Share]]:
    """``verdict`` and its shares with each leak that a torch profiler holds
    (:func:`~harness._attribution.findings.held_by_profiler`) made the profiler's own finding,
    when no profiler records as the run ends (one still recording leaks, as any holder does)."""
    if not found:
        return verdict, []
    from harness._attribution.findings import held_by_profiler
    from harness._attribution.torch_state import profiler_recording

    if profiler_recording():
        return verdict, list(found)
    phases = {s.phase for s in found if held_by_profiler(s, verdict.rules.max_growth)}
    return as_profilers(verdict, phases), [
        replace(s, kind=Kind.PROFILER.value) if s.kind == Kind.LEAK and s.phase in phases else s
        for s in found
    ]


def _profiled_phases(kept: Mapping[str, Any]) -> set[str | None]:
    """The phases whose leaks a run's end record says a stopped profiler held."""
    shares = kept.get("shares")
    return {
        s["phase"]
        for s in (shares if isinstance(shares, list) else ())
        if isinstance(s, Mapping)
        and s.get("kind") == Kind.PROFILER
        and isinstance(s.get("phase"), (str, type(None)))
    }


def as_profilers(verdict: Verdict, phases: Collection[str | None]) -> Verdict:
    """``verdict`` with the leaks of ``phases`` turned into ``profiler`` findings (a warning:
    the growth is a stopped profiler's recorded events), their failed checks and loops into
    warnings, and its status decided again (a FAIL left with no blocking finding passes, or is
    the ERROR its unjudged rules made)."""
    turned = {f.rule for f in verdict.findings if f.kind == Kind.LEAK and f.phase in phases}
    if not turned:
        return verdict
    findings = tuple(
        _profiler(f) if f.kind == Kind.LEAK and f.phase in phases else f for f in verdict.findings
    )
    scopes = {scope(p.phase, p.epoch) for p in verdict.phases if p.phase in phases}
    checks = tuple(
        replace(c, status=CheckStatus.WARN, details=f"{c.details}; held by a stopped profiler")
        if c.status == CheckStatus.FAIL and c.rule in turned and c.scope.split(" (")[0] in scopes
        else c
        for c in verdict.checks
    )
    failing = {c.scope for c in checks if c.status == CheckStatus.FAIL}
    loops = tuple(
        replace(p, status=CheckStatus.WARN)
        if p.status == CheckStatus.FAIL and scope(p.phase, p.epoch) in scopes - failing
        else p
        for p in verdict.phases
    )
    status, error = verdict.status, verdict.error
    if status == Status.FAIL:
        unjudged = [c.details for c in checks if c.status == CheckStatus.ERROR and c.scope == "run"]
        status, error = decide(findings, unjudged=unjudged[0] if unjudged else None)
    return replace(
        verdict, status=status, error=error, findings=findings, checks=checks, phases=loops
    )


def _profiler(leak: Finding) -> Finding:
    """A leak's finding as a stopped profiler's."""
    from harness._attribution.torch_state import PROFILER

    said = leak.message.removeprefix(f"{Kind.LEAK} ")
    message = (
        f"{Kind.PROFILER} {said}; held by {PROFILER}, stopped before the run ended: its "
        "recorded events, not a leak"
    )
    return replace(leak, kind=Kind.PROFILER, message=message, outcome=None)


def _named(explained: Sequence[Share]) -> list[Holder]:
    if not explained:
        return []
    from harness._attribution.findings import named

    return named(h for share in explained for h in share.holders)


def _test_of(header: Mapping[str, Any]) -> str | None:
    """A run's title as its header keeps it: the test's id, else the title its run gave."""
    meta = header.get("meta")
    meta = meta if isinstance(meta, Mapping) else {}
    return next((v for v in (meta.get("test"), meta.get("title")) if isinstance(v, str)), None)


def relative(path: str | os.PathLike[str] | None, here: Path) -> str | None:
    """``path`` as the report in ``here`` links to it: relative where it can be."""
    if path is None:
        return None
    try:
        return os.path.relpath(path, here)
    except ValueError:  # another drive
        return str(path)

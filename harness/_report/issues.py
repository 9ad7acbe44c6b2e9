"""The report's findings: the Issues Found section (evidence, suspected root cause and
recommended fix for each finding, causes before their symptoms) and the Executive Summary's
root-cause line. Who holds the memory comes from the run's attribution; the cause and fix
text comes from :mod:`harness._report.advice`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness._core.markdown import Markdown, code, spans, text
from harness._core.units import echo_size, format_mib, format_rate, format_size
from harness._core.wording import plural
from harness._measure.sample import Sample
from harness._report.advice import advise
from harness._report.analysis import scope_label
from harness._report.run import Run, as_int, checkpoint_name, describe
from harness._verdict.model import CONFIGURATION, Finding, Kind, Outcome, Status, Verdict

HOLDER_KINDS = (Kind.LEAK, Kind.PEAK, Kind.TEARDOWN, Kind.OOM)
MESSAGE_CHARS = 600
"""Characters kept of a finding's message."""
ROOT_CAUSE_ORDER = (
    Kind.LEAK,
    Kind.CHILD_LEAK,
    Kind.PEAK,
    Kind.TEARDOWN,
    Kind.CHECK,
    Kind.DRIFT,
    Kind.OOM,
    Kind.COPY_ON_READ,
    Kind.FRAGMENTATION,
    Kind.PROFILER,
)
"""The order of issues of one severity: causes before symptoms (a leak or a peak explains an
OOM)."""
KIND_TITLE = {
    Kind.LEAK: "Leak",
    Kind.PEAK: "Peak",
    Kind.DRIFT: "Drift",
    Kind.TEARDOWN: "Memory kept after teardown",
    Kind.OOM: "Out of memory",
    Kind.CHECK: "Trainer check failed",
    Kind.FRAGMENTATION: "Fragmentation",
    Kind.CHILD_LEAK: "Leak in a child process",
    Kind.COPY_ON_READ: "Copy-on-read in workers",
    Kind.PROFILER: "Held by a torch profiler stopped before the end",
}


def issues(run: Run) -> list[str]:
    lines = ["## Issues Found", ""]
    verdict = run.verdict
    if verdict.error:
        lines += [error_sentence(verdict), ""]
    if not verdict.findings:
        if verdict.status == Status.ERROR:
            return [*lines, "No finding: the verdict is ERROR for the reason above."]
        return [*lines, "None: no rule was broken."]
    for n, finding in enumerate(ranked(verdict.findings), start=1):
        cause, fix = advice(run, finding)
        lines += [
            f"### Issue {n} ({finding.severity}): "
            f"{text(KIND_TITLE.get(finding.kind, str(finding.kind).capitalize()))} in "
            f"{text(scope_label(finding.phase, finding.epoch))}",
            "",
            f"- **Evidence:** {evidence(finding)}",
            *([f"- **Re-check:** {checked}"] if (checked := recheck_note(run, finding)) else []),
            f"- **Suspected root cause:** {cause}",
            f"- **Recommended fix:** {fix}",
            "",
        ]
    return lines[:-1]


def error_sentence(verdict: Verdict) -> str:
    """Why an ERROR verdict is one, by its kind: the run raised, a configuration mistake (with
    its likely fix), or a rule asked for that had no evidence."""
    error = verdict.error or "an error"
    kind = verdict.error_kind
    if kind == "raised":
        return f"The run raised {code(error)}; its timeline was judged up to there."
    if kind == CONFIGURATION:
        return f"**Configuration mistake:** {spans(error)}."
    return f"A rule asked for had no evidence: {code(error)}."


def root_cause(run: Run) -> Markdown | None:
    """The Executive Summary's root-cause sentence, ``None`` when nothing failed: the most
    severe finding (:meth:`Verdict.worst`); for an out-of-memory, the leak or peak of its phase
    that explains it when there is one."""
    verdict = run.verdict
    worst = verdict.worst()
    if verdict.passed or worst is None or not worst.blocking:
        return None
    cause = explanation(worst, verdict.findings) if worst.kind == Kind.OOM else None
    said: str = text((cause or worst).message, MESSAGE_CHARS)
    if cause is not None:
        said += (
            f", which ran the device out of memory in {text(scope_label(worst.phase, worst.epoch))}"
        )
    holders = holders_for(run, cause or worst)
    if holders:
        said += f"; {holder_text(holders[0])}"
    return Markdown(said + ("" if said.endswith(".") else "."))


def explanation(oom: Finding, findings: Sequence[Finding]) -> Finding | None:
    """The finding that explains an out-of-memory: a leak, else a peak, of its phase (of its
    epoch first, then the largest)."""
    for kind in (Kind.LEAK, Kind.PEAK):
        found = [f for f in findings if f.kind == kind and f.phase == oom.phase]
        if found:
            return max(found, key=lambda f: (f.epoch == oom.epoch, as_int(f.bytes) or 0))
    return None


def recheck_note(run: Run, finding: Finding) -> Markdown | None:
    """What a leak's re-check compared: the loop's fitted start level against the reading
    after the loop that released the memory, or against the collected one that still held
    it. ``None`` for other findings, for a run that stopped inside the loop (no reading of the
    phase after it, where a re-check could have been), or when the judged loop cannot be found
    again."""
    if finding.kind != Kind.LEAK or finding.outcome is None:
        return None
    if finding.outcome == Outcome.UNCHECKED:
        if not went_on(run, finding):
            return None
        return Markdown("no collected reading after the loop, so the growth inside it stands.")
    if len(finding.evidence) < 3:
        return None
    after = finding.evidence[-1]
    stats = next(
        (p for p in run.verdict.phases if (p.phase, p.epoch) == (finding.phase, finding.epoch)),
        None,
    )
    value = as_int(after.value)
    if stats is None or stats.baseline is None or stats.metric != after.metric or value is None:
        return None
    level = stats.baseline
    rules = run.verdict.rules
    budget = text(echo_size(rules.shown("max_growth"), rules.max_growth))
    where = text(checkpoint_name(Sample(after.label, after.phase, after.epoch, after.batch)))
    against = (
        f"against the loop's fitted start level of {format_mib(level)} ({code(stats.metric)}, "
        f"read over the first {plural(stats.baseline_batches or 0, 'batch', 'batches')} after "
        "the warm-up): "
        f"{format_size(value - level, signed=True)}"
    )
    if finding.outcome == Outcome.RELEASED:
        grown = format_size(finding.bytes, signed=True)
        return Markdown(
            f"{where} read {format_mib(value)} after the loop, {against}, within max_growth "
            f"{budget}, so the memory was released when the phase ended; inside the loop it "
            f"grew {grown}."
        )
    return Markdown(
        f"{where} (collected) read {format_mib(value)} after the loop, {against}, more than "
        f"max_growth {budget}, so the memory was still held after a full collection."
    )


def went_on(run: Run, finding: Finding) -> bool:
    """Whether ``finding``'s phase and epoch have a reading after its last evidence (the loop's
    last judged batch) that is not a batch of the loop; True when that cannot be found."""
    last = finding.evidence[-1] if finding.evidence else None
    if last is None or not 0 <= last.index < len(run.samples):
        return True
    later = (run.samples[i] for i in range(last.index + 1, len(run.samples)))
    return any(
        (s.phase, s.epoch) == (finding.phase, finding.epoch) and s.batch is None for s in later
    )


def advice(run: Run, finding: Finding) -> tuple[str, str]:
    """The suspected root cause and the recommended fix for ``finding``."""
    holders = holders_for(run, finding)
    described = holder_text(holders[0]) if holders else ""
    if len(holders) > 1:
        described += "; also " + "; ".join(holder_text(h) for h in holders[1:3])
    return advise(
        finding,
        run.verdict.findings,
        phase=text(finding.phase) if finding.phase else "the run",
        size=format_size(as_int(finding.bytes)),
        holders=described,
        holder=holder_name(holders[0]) if holders and holders[0].get("path") else "",
    )


def ranked(findings: Sequence[Finding]) -> list[Finding]:
    """Findings, causes before their symptoms (see :data:`ROOT_CAUSE_ORDER`)."""
    return sorted(findings, key=issue_order)


def order(kind: Kind) -> int:
    return ROOT_CAUSE_ORDER.index(kind) if kind in ROOT_CAUSE_ORDER else len(ROOT_CAUSE_ORDER)


def issue_order(finding: Finding) -> tuple[int, int]:
    """Issues in order of severity, then cause before symptom."""
    return -finding.severity.rank, order(finding.kind)


def holders_for(run: Run, finding: Finding) -> list[Mapping[str, Any]]:
    """The holders that may explain ``finding``, biggest first: those of its phase (a teardown's
    is ``session``) and those without a phase; every holder for a finding without a phase."""
    if finding.kind not in HOLDER_KINDS:
        return []
    matching = [
        h
        for h in run.holders
        if isinstance(h, Mapping)
        and (finding.phase is None or h.get("phase") in (None, finding.phase))
    ]
    return sorted(matching, key=lambda h: -(as_int(h.get("bytes")) or 0))


def holder_text(holder: Mapping[str, Any]) -> Markdown:
    """``held by Trainer._attn_cache (list, 176 items, 2.3MiB), allocated at tft/faults.py:42``"""
    details: list[str] = []
    if holder.get("container") is not None:
        details.append(text(describe(holder["container"])))
    items = as_int(holder.get("items"))
    if items is not None:
        details.append(plural(items, "item"))
    size = as_int(holder.get("bytes"))
    if size is not None:
        details.append(format_size(size))
    said = f"held by {holder_name(holder)}" if holder.get("path") else "held by an unnamed object"
    if isinstance(holder.get("process"), str):
        said = f"held in {text(holder['process'])} " + said.removeprefix("held ")
    if details:
        said += f" ({', '.join(details)})"
    sites = holder.get("sites")
    if isinstance(sites, (list, tuple)) and sites:
        said += ", allocated at " + ", ".join(code(s) for s in sites[:3])
    return Markdown(said)


def holder_name(holder: Mapping[str, Any]) -> Markdown:
    """A holder's path as code: what a user edits. A merged run's ``rank N: `` before it is
    text, outside the code."""
    path = str(holder.get("path"))
    rank = f"rank {holder.get('rank')}: "
    if "rank" in holder and path.startswith(rank) and path != rank:
        return Markdown(text(rank.strip()) + " " + code(path.removeprefix(rank)))
    return code(path)


def evidence(finding: Finding) -> Markdown:
    said: str = text(finding.message, MESSAGE_CHARS)
    readings = []
    for e in finding.evidence:
        value = as_int(e.value)
        where = checkpoint_name(Sample(e.label, e.phase, e.epoch, e.batch))
        readings.append(f"{text(where)} = {format_mib(value)} ({text(e.metric or 'n/a')})")
    if readings:
        said += ". Readings: " + "; ".join(readings[:12])
    if finding.slope is not None:
        said += f". Slope {format_rate(finding.slope)}"
    return Markdown(said + ".")

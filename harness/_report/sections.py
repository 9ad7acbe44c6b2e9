"""The report's frame: :func:`render_report` and the sections around the memory and findings
sections (title, Executive Summary, Configuration, Test Results Summary, Final Verdict, Logs),
in the order of the verification report a team wrote by hand for the TFT incident. No section
raises on what a timeline may hold: missing header keys, an empty or partial timeline and
findings without evidence render as ``n/a`` or a sentence saying so.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from harness._core.markdown import Markdown, code, link_to, spans, strong, table, text
from harness._core.units import echo_size, format_mib
from harness._core.wording import plural
from harness._report.analysis import analysis, status
from harness._report.chart import chart
from harness._report.issues import MESSAGE_CHARS, issues, ranked, root_cause
from harness._report.profile import profile
from harness._report.ranks import rank_logs, rank_rows
from harness._report.run import Run, as_int, checkpoint_name, describe, ended, epochs
from harness._verdict.model import CONFIGURATION, CheckStatus, Status, Verdict
from harness._verdict.options import Rules, judged_options


def render_report(run: Run) -> str:
    """The report as markdown text."""
    sections = [
        title(run),
        summary(run),
        configuration(run),
        profile(run),
        chart(run),
        issues(run),
        analysis(run),
        results(run),
        final(run),
        logs(run),
    ]
    return "\n\n".join("\n".join(lines) for lines in sections if lines) + "\n"


def title(run: Run) -> list[str]:
    name = text(run.title or run.name) or "unnamed run"
    return [
        f"# Memory report: {name}",
        "",
        f"{date(run.header.get('started'))} · {device(run.header)} · "
        f"verdict {strong(run.verdict.status)}",
    ]


def summary(run: Run) -> list[str]:
    lines = [
        "## Executive Summary",
        "",
        f"- **Environment:** {environment(run.header)}",
        f"- **Run:** {run_line(run)}",
        f"- **Verdict:** {verdict_line(run.verdict)}",
    ]
    cause = root_cause(run)
    if cause:
        lines.append(f"- **Root cause:** {cause}")
    return lines


def configuration(run: Run) -> list[str]:
    config, meta = run.config, run.meta
    capacity = run.capacity
    if capacity is None:
        capacity_text = "n/a"
    elif run.header.get("capacity_emulated"):
        real = as_int(run.header.get("total_memory"))
        capacity_text = f"{format_mib(capacity)} (emulated; device {format_mib(real)})"
    else:
        capacity_text = f"{format_mib(capacity)} (real)"
    rows = [
        ("Device", device(run.header)),
        ("Capacity", capacity_text),
        ("Batch size", describe(config.get("batch_size"))),
        ("Validation batch size", describe(config.get("validation_batch_size"))),
        ("Epochs", describe(config.get("epochs"))),
        ("Training samples", describe(meta.get("train_samples"))),
        ("Validation samples", describe(meta.get("val_samples"))),
        (
            "Probe / metric",
            f"{describe(run.header.get('probe'))} / {describe(run.metric)}"
            f" (primary: {describe(run.header.get('primary'))})",
        ),
        ("Rules", text(rules_text(run.verdict), RULES_CHARS)),
    ]
    if "faults" in meta:
        rows.append(("Faults", describe(meta.get("faults"))))
    if "test" in meta:
        rows.append(("Test", code(describe(meta.get("test")))))
    shown_config = {"batch_size", "validation_batch_size", "epochs"}
    shown_meta = {"train_samples", "val_samples", "faults", "test", "rules"}
    other = [f"{k}={describe(v)}" for k, v in config.items() if k not in shown_config]
    other += [f"{k}={describe(v)}" for k, v in meta.items() if k not in shown_meta]
    if other:
        rows.append(("Other settings", ", ".join(other)))
    rows += rank_rows(run)
    notes = run.header.get("notes")
    if isinstance(notes, list) and notes:
        rows.append(("Probe notes", "; ".join(describe(n) for n in notes[:20])))
    return ["## Configuration", "", *table(("Setting", "Value"), rows)]


def results(run: Run) -> list[str]:
    lines = ["## Test Results Summary", ""]
    checks = run.verdict.checks
    if not checks:
        return [*lines, "No rule was checked."]
    rows = [(c.rule, c.scope, status(c.status), c.details) for c in checks]
    return [*lines, *table(("Rule", "Scope", "Status", "Details"), rows)]


def final(run: Run) -> list[str]:
    verdict = run.verdict
    ran = [c for c in verdict.checks if c.status != CheckStatus.SKIP]
    passing = [c for c in ran if c.status in (CheckStatus.PASS, CheckStatus.WARN)]
    share = 100 * len(passing) / len(ran) if ran else 0.0
    completion = f"Completion: {len(passing)}/{len(ran)} checks passing ({share:.0f}%)"
    skipped = len(verdict.checks) - len(ran)
    warned = sum(c.status == CheckStatus.WARN for c in ran)
    extras = [f"{skipped} skipped"] * bool(skipped) + [f"{warned} with a warning"] * bool(warned)
    if extras:
        completion += f", {', '.join(extras)}"
    lines = [
        "## Final Verdict",
        "",
        f"**ALL CHECKS PASSING: {'YES' if verdict.passed else 'NO'}** (verdict {verdict.status})",
        "",
        completion + ".",
    ]
    remaining = [f for f in ranked(verdict.findings) if f.blocking]
    if remaining:
        listed = "; ".join(f"{f.severity} {text(f.message, MESSAGE_CHARS)}" for f in remaining)
        lines += ["", f"Remaining: {listed}"]
    if run.torn or ended(run) is False:
        lines += ["", "Judged on an incomplete timeline: the run did not reach its end."]
    return lines


def logs(run: Run) -> list[str]:
    count = plural(len(run.samples), "checkpoint")
    if run.torn:
        count += f"; {run.torn} torn last line skipped: the writer was killed mid-line"
    timeline = link_to(run.timeline, run.timeline) if run.timeline else "not written"
    verdict = link_to(run.verdict_file, run.verdict_file) if run.verdict_file else "not written"
    return [
        "## Logs",
        "",
        *(rank_logs(run) or [f"- Timeline (JSONL): {timeline} ({count})"]),
        f"- Verdict (JSON): {verdict}",
    ]


def environment(header: Mapping[str, Any]) -> Markdown:
    parts: list[str] = [device(header)]
    for key, name in (
        ("torch", "torch"),
        ("python", "Python"),
        ("leakgate", "leakgate"),
        ("driver", "driver"),
        ("host", "host"),
    ):
        if header.get(key):
            parts.append(f"{name} {text(describe(header[key]))}")
    commit = header.get("git_commit")
    if isinstance(commit, str) and commit:
        parts.append(f"commit {text(commit[:10])}")
    return Markdown(" · ".join(parts))


def run_line(run: Run) -> Markdown:
    done, planned = epochs(run)
    if planned is not None:
        line = f"{done} of {planned} epochs completed"
    elif done:
        line = f"{done} epochs completed (planned: n/a)"
    else:
        line = "epochs: n/a"
    line += f" · {plural(len(run.samples), 'checkpoint')}"
    times = run.times()
    times = times[times > 0]
    if len(times) > 1:
        line += f" over {times.max() - times.min():.1f} s"
    finished = ended(run)
    if finished is False and run.samples:
        line += f" · stopped at {text(checkpoint_name(run.samples[-1]))}, before the end of the run"
    elif finished is None and planned is not None and done < planned and run.samples:
        line += f" · stopped at {text(checkpoint_name(run.samples[-1]))}"
    if run.torn:
        line += " · timeline cut short (torn last line skipped)"
    return Markdown(line)


def verdict_line(verdict: Verdict) -> str:
    if verdict.status == Status.ERROR:
        kind = verdict.error_kind
        if kind == CONFIGURATION:
            return f"ERROR, a configuration mistake: {spans(verdict.error or 'an error')}"
        return f"ERROR: {'the run raised ' * (kind == 'raised')}{code(verdict.error or 'an error')}"
    counts: dict[str, int] = {}
    for f in verdict.findings:
        counts[f.severity] = counts.get(f.severity, 0) + 1
    found = ", ".join(f"{n} {sev}" for sev, n in sorted(counts.items()))
    ran = sum(c.status != CheckStatus.SKIP for c in verdict.checks)
    if verdict.status == Status.PASS:
        text = f"PASS: every rule checked held ({plural(ran, 'check')})"
        return text + (f"; warnings: {found}" if found else "")
    noun = "finding" if len(verdict.findings) == 1 else "findings"
    return f"{verdict.status}: {found or 'no'} {noun} in {plural(ran, 'check')}"


RULES_CHARS = 1000
"""Characters kept of the rules row (every option is listed: more than a cell's usual cut)."""


def rules_text(verdict: Verdict) -> str:
    """The rules in force, as plain text (a table escapes it): every option that decides a
    verdict, from :class:`Rules`' declaration, then the options of registered rules."""
    rules = verdict.rules
    parts = [f"{o.name} {option_text(rules, o.name, o.metadata['kind'])}" for o in judged_options()]
    parts += [f"{name} {describe(value)}" for name, value in rules.custom.items()]
    return " · ".join(parts)


def option_text(rules: Rules, name: str, kind: str) -> str:
    """One option's value as the report shows it: a size as written (with its binary figure),
    ``all`` phases, ``yes``/``no`` for a flag, ``off`` for a rule switched off."""
    value = getattr(rules, name)
    if kind == "size":
        return echo_size(rules.shown(name), value)
    if kind == "phases":
        return ", ".join(value) if value else "all"
    if kind == "flag":
        return "yes" if value else "no"
    return "off" if value is None else describe(value)


def device(header: Mapping[str, Any]) -> Markdown:
    parts = [text(describe(p)) for p in (header.get("probe"), header.get("device")) if p]
    return Markdown(": ".join(parts) if parts else "device n/a")


def date(started: Any) -> str:
    if isinstance(started, bool) or not isinstance(started, (int, float)):
        return "date n/a"
    try:
        when = dt.datetime.fromtimestamp(started, tz=dt.UTC)
    except (OverflowError, OSError, ValueError):
        return "date n/a"
    return when.strftime("%Y-%m-%d %H:%M UTC")

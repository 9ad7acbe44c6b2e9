"""``python -m harness``: rebuild a report from a timeline, compare two verdicts, index a folder,
gate a folder of verdicts against a baseline (what CI runs), merge a distributed run's rank
timelines, read a history across commits, bisect, and prove the measuring path (``selfcheck``).

Exit codes: 0 pass (no regression), 1 fail or regression, 2 bad input (a missing or unreadable
file, not JSON, not a timeline or verdict, a field of the wrong type, a schema too new, an
output that would replace the input, a file that cannot be written): one line on stderr, no
traceback. :func:`main` maps leakgate's errors (:mod:`harness._core.errors`) to that code in one
place and returns it, argparse's included (0 for ``--help``, 2 for a usage error). Every file is
written atomically (:mod:`harness._core.fsio`).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

from harness._core.errors import (
    BadInput,
    LeakgateError,
    UnwritableReport,
    as_bad_input,
    as_unwritable,
    one_line,
)
from harness._core.fsio import make_folders, would_replace
from harness._core.identity import check_world_size
from harness._core.naming import check_file_name, rebuilt
from harness._frontends.command_line import build_parser
from harness._frontends.gate import FAIL, PASS, comparison_lines, gate_folder, write_index_to
from harness._report.sections import render_report
from harness._results.artifacts import compare_runs, load_run_document
from harness._results.finish import finish_run, rules_of, summary_line
from harness._results.merge import merge_timelines
from harness._timeline.columns import pyarrow_without_pandas
from harness._timeline.jsonl import Timeline, read_timeline
from harness._verdict.options import Rules, judged_options

BAD_INPUT = 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command; returns the exit code (argparse's for ``--help`` and usage errors)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command_after = []  # bisect's test command: all after its --, options of its own included
    if argv[:1] in (["bisect"], ["bisect-step"]) and "--" in argv:
        argv, command_after = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else BAD_INPUT
    if command_after:
        args.test_command = command_after
    command = {
        "report": _report,
        "compare": _compare,
        "index": _index,
        "gate": _gate,
        "merge": _merge,
        "history": _history,
        "bisect": _bisect,
        "bisect-step": _bisect_step,
        "selfcheck": _selfcheck,
    }[args.command]
    try:
        return command(args)
    except UnwritableReport as exc:
        print(f"error: {exc.path}: cannot write ({exc.reason})", file=sys.stderr)
        return BAD_INPUT
    except LeakgateError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return BAD_INPUT


def _selfcheck(args: argparse.Namespace) -> int:
    from harness._frontends.selfcheck import main as selfcheck

    return selfcheck(["--cuda"] if args.cuda else [])


def _report(args: argparse.Namespace) -> int:
    _check_outputs(args)
    try:
        with pyarrow_without_pandas():
            timeline = read_timeline(args.timeline)
    except OSError as exc:
        raise BadInput(f"cannot read ({exc.strerror or exc})", path=args.timeline) from None
    except ValueError as exc:
        raise as_bad_input(exc) from None
    rules = _rules(args, timeline)
    markdown, document = _outputs(args)
    replaced = [p for p in (markdown, document) if p is not None and p.exists()]
    to_stdout = args.output == "-"
    try:
        for path in (markdown, document):
            if path is not None:
                make_folders(path.parent)
        finished = finish_run(
            timeline,
            rules,
            name=args.timeline.stem,
            markdown=markdown,
            document=document,
            timeline=args.timeline,
            title=args.title,
        )
    except (ValueError, TypeError, KeyError) as exc:
        problem = f"cannot judge its samples ({one_line(exc)})"
        raise BadInput(problem, path=args.timeline) from None
    except OSError as exc:
        raise as_unwritable(exc, markdown) from None
    if finished.write_error is not None:
        raise as_unwritable(finished.write_error, markdown)
    if to_stdout:
        sys.stdout.write(render_report(finished.run))
    written = " and ".join(
        f"{p} (replaced)" if p in replaced else str(p) for p in (markdown, document) if p
    )
    summary = summary_line(finished.verdict)
    if timeline.torn:
        summary += f", {timeline.torn} torn line skipped"
    print(
        summary + (f"; wrote {written}" if written else ""), file=sys.stderr if to_stdout else None
    )
    return PASS if finished.verdict.passed else FAIL


def _outputs(args: argparse.Namespace) -> tuple[Path | None, Path | None]:
    """Where the report and the verdict go: ``-o`` (and ``--json``) as given; else beside the
    timeline as ``<name>.md`` and ``.json``, or, when the run's own report or verdict is there,
    as ``<name>.rebuilt.md`` and ``.json``, so a rebuild never replaces the original."""
    if args.output == "-":
        return None, None
    markdown = Path(args.output) if args.output else args.timeline.with_suffix(".md")
    if not args.output and (markdown.exists() or markdown.with_suffix(".json").exists()):
        markdown = rebuilt(markdown)
    document = None if args.no_json else Path(args.json or markdown.with_suffix(".json"))
    return markdown, document


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse, before anything is read or written, a report or verdict path whose write would
    replace the input timeline (through a linked folder, a link or a hard link too), and one
    path for both outputs."""
    markdown, document = _outputs(args)
    if markdown is None:
        return
    for kind, path in (("report", markdown), ("verdict", document)):
        if path is not None and would_replace(path, args.timeline):
            raise BadInput(f"is the input timeline; the {kind} must go elsewhere", path=path)
    if document is not None and would_replace(markdown, document):
        raise BadInput("the report and the verdict cannot be written to one file", path=markdown)


def _rules(args: argparse.Namespace, timeline: Timeline) -> Rules:
    """The rules the timeline's run was judged by, each overridden by an option given on the
    command line."""
    try:
        stored = rules_of(timeline.header, timeline.end)
        given = {o.name: getattr(args, o.name) for o in judged_options()}
        given = {k: tuple(v) if k == "phase" else v for k, v in given.items() if v is not None}
        written = {k: v for k, v in stored.written.items() if k not in given}
        return dataclasses.replace(stored, **given, written=written)
    except (ValueError, TypeError) as exc:
        raise BadInput(one_line(exc), field="rules") from None


def _compare(args: argparse.Namespace) -> int:
    try:
        base, new = load_run_document(args.base), load_run_document(args.new)
    except ValueError as exc:
        raise as_bad_input(exc) from None
    comparison = compare_runs(base, new, tolerance=args.tolerance, min_bytes=args.min_bytes)
    for line in comparison_lines(comparison):
        print(line)
    return FAIL if comparison.regressed else PASS


def _index(args: argparse.Namespace) -> int:
    write_index_to(args.directory)
    return PASS


def _gate(args: argparse.Namespace) -> int:
    with pyarrow_without_pandas():
        return gate_folder(
            args.directory,
            args.baseline,
            tolerance=args.tolerance,
            min_bytes=args.min_bytes,
            history=args.history,
            max_creep=args.max_creep,
        )


def _history(args: argparse.Namespace) -> int:
    from harness._history.archive import open_history
    from harness._history.page import render_page, since_time, write_page
    from harness._history.series import Selection

    history = open_history(args.history)
    since = None if args.since is None else since_time(history, args.since)
    with pyarrow_without_pandas():
        page = render_page(history, Selection(args.test, since, args.metric))
    try:
        write_page(page, args.output)
    except OSError as exc:
        raise as_unwritable(exc, args.output) from None
    if args.output not in (None, "-"):
        print(f"wrote {args.output}")
    return PASS


def _bisect(args: argparse.Namespace) -> int:
    from harness._history.bisect import bisect

    return bisect(args.good, args.bad, args.test_command, args.history, args.max_silent)


def _bisect_step(args: argparse.Namespace) -> int:
    """One commit for ``git bisect run``: never 2, which git would read as bad."""
    from harness._history.bisect import SKIP, step

    try:
        return step(args.test_command, args.state, args.driver)
    except (LeakgateError, OSError) as exc:
        print(f"leakgate bisect: skipped ({one_line(exc)})", file=sys.stderr)
        return SKIP


def _merge(args: argparse.Namespace) -> int:
    """Merge the rank timelines; ``--name`` and ``--world-size`` are checked before anything is
    read, and no output may replace an input (:func:`~harness._results.merge.merge_timelines`)."""
    try:
        if args.name is not None:
            check_file_name(args.name, "--name")
        if args.world_size is not None:
            try:
                check_world_size(args.world_size)
            except ValueError as exc:
                raise BadInput(f"--world-size: {exc}") from None
        with pyarrow_without_pandas():
            finished = merge_timelines(
                args.timelines, name=args.name, directory=args.directory, world_size=args.world_size
            )
    except OSError as exc:
        where = exc.filename or args.timelines[0]
        raise BadInput(f"{where}: cannot read ({exc.strerror or exc})") from None
    except (ValueError, TypeError) as exc:
        raise BadInput(one_line(exc)) from None
    return finished.exit_code()

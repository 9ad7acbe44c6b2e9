"""``python -m harness``: rebuild a report from a timeline, compare two verdicts, index a folder,
gate a folder of verdicts against a baseline (what CI runs), merge a distributed run's rank
timelines, read a history across commits, bisect, and prove the measuring path (``selfcheck``).

Exit codes: 0 pass (no regression), 1 fail or regression, 2 bad input (a missing or unreadable
file, not JSON, not a timeline or verdict, a field of the wrong type, a schema too new, an
output that would replace the input, a file that cannot be written): one line on stderr, no
traceback. :func:`main` maps leakgate's errors (:mod:`harness.core.errors`) to that code in one
place and returns it, argparse's included (0 for ``--help``, 2 for a usage error). Every file is
written atomically (:mod:`harness.core.fsio`).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness.core.errors import (
    BadInput,
    LeakgateError,
    UnwritableReport,
    as_bad_input,
    as_unwritable,
    one_line,
)
from harness.core.fsio import make_folders, would_replace
from harness.core.identity import check_world_size
from harness.core.naming import check_file_name, rebuilt
from harness.core.units import parse_size
from harness.frontends.gate import FAIL, PASS, comparison_lines, gate_folder, write_index_to
from harness.history.creep import DEFAULT_CREEP, CreepLimit
from harness.report.sections import render_report
from harness.results.artifacts import (
    DEFAULT_MIN_BYTES,
    DEFAULT_TOLERANCE,
    compare_runs,
    load_run_document,
)
from harness.results.finish import finish_run, rules_of, summary_line
from harness.results.merge import merge_timelines
from harness.timeline.columns import pyarrow_without_pandas
from harness.timeline.jsonl import INT64_BOUND, Timeline, read_timeline
from harness.verdict.options import Rules, judged_options

BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="leakgate",
        description="leakgate: memory reports and verdict comparison.",
        epilog="exit codes: 0 pass, 1 fail or regression, 2 bad input",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    report = commands.add_parser(
        "report",
        help="rebuild the markdown report (and JSON verdict) from a timeline",
        description="Judge a timeline (a crashed run's too: a torn last line is skipped) and "
        "write its report. Rules come from the timeline header's meta.rules when present; "
        "the options below override them one by one.",
    )
    report.add_argument("timeline", type=Path, metavar="TIMELINE.jsonl")
    report.add_argument(
        "-o",
        "--output",
        metavar="OUT.md",
        help="report path (default: TIMELINE with .md, or with .rebuilt.md when the run's own "
        "report or verdict is there; - for stdout)",
    )
    report.add_argument(
        "--json", type=Path, metavar="OUT.json", help="verdict path (default: OUT with .json)"
    )
    report.add_argument("--no-json", action="store_true", help="write no JSON verdict")
    report.add_argument("--title", help="report title (default: the test id or file name)")
    for option in judged_options():
        kind = option.metadata["kind"]
        flag = "--" + option.name.replace("_", "-")
        text = option.metadata["help"].replace("%", "%%")
        if kind == "phases":
            report.add_argument(flag, action="append", help=f"{text} (repeatable)")
        elif kind == "flag":
            report.add_argument(flag, action="store_const", const=True, help=text)
        else:
            report.add_argument(
                flag,
                type={"count": _count, "size": _size_text(flag)}.get(kind, str),
                metavar={"count": "N", "size": "SIZE"}.get(kind, "NAME"),
                help=text,
            )

    compare = commands.add_parser(
        "compare",
        help="compare two verdicts; exit 1 on a regression beyond the tolerance",
        description="Compare what the rules judged: each phase's growth, slope and peak rise, "
        "and the teardown residue (checkpoint levels are not compared: they depend on what ran "
        "before). A value regresses when it grew by more than the tolerance and by more than "
        "--min-bytes (for a slope, --min-bytes over the phase's judged batches); a base that "
        "passed and a new run that did not is a regression too, and so is a comparison with "
        "nothing in common.",
    )
    compare.add_argument("base", type=Path, metavar="BASE.json")
    compare.add_argument("new", type=Path, metavar="NEW.json")
    _tolerance_options(compare)

    index = commands.add_parser(
        "index", help="rewrite DIR/index.md from the verdicts in DIR (no baseline compared)"
    )
    index.add_argument("directory", type=Path, metavar="DIR")

    gate = commands.add_parser(
        "gate",
        help="exit 1 if any verdict in DIR fails or regresses against a baseline; DIR/index.md "
        "shows the decision",
        description="Check every verdict in DIR, then write DIR/index.md with the decision above "
        "its table (when the input is refused, an index that says so): any status but PASS "
        "fails the gate, and so does a regression against the same-named verdict in BASELINE "
        "(verdicts without a baseline are listed and checked for their status only). Each "
        "timeline X.jsonl in DIR needs its X.json from the same run (run_id), and must have "
        "ended (its end record, or in an older timeline its end checkpoint); every verdict in "
        "BASELINE must be in DIR. Rebuilt copies (X.rebuilt.json) are not read. A DIR without "
        "verdicts, or a BASELINE that is not a folder of verdicts, is bad input: a gate that "
        "judged nothing must not pass.",
    )
    gate.add_argument("directory", type=Path, metavar="DIR")
    gate.add_argument("--baseline", type=Path, metavar="BASELINE", help="folder of base verdicts")
    _tolerance_options(gate)
    gate.add_argument(
        "--history",
        metavar="HISTORY",
        help="append the gated verdicts to this history (a folder or a pyarrow URI) as one run",
    )
    gate.add_argument(
        "--max-creep",
        nargs="?",
        const=CreepLimit.parse(DEFAULT_CREEP),
        type=_creep,
        metavar="PCT/RUNS",
        help=f"fail a test whose peak or growth rose significantly by more than PCT over its "
        f"last RUNS comparable runs in --history (default {DEFAULT_CREEP.replace('%', '%%')})",
    )
    _history_commands(commands)

    merge = commands.add_parser(
        "merge",
        help="merge the rank timelines of one distributed run into one report and verdict",
        description="Merge the rank timelines of one distributed run into <name>.md and "
        "<name>.json beside them (each rank judged on its own rules, then the ranks compared). "
        "Exit 0 on PASS, 1 otherwise.",
    )
    merge.add_argument("timelines", nargs="+", type=Path, metavar="NAME.rankN.jsonl")
    merge.add_argument("--name", help="the run's name (default: the timelines')")
    merge.add_argument("--directory", type=Path, help="where the report goes (default: theirs)")
    merge.add_argument("--world-size", type=int, help="ranks the run had (default: the headers')")
    check = commands.add_parser(
        "selfcheck",
        help="prove the measuring path on this machine, in minutes",
        description="A known allocation read, a leak and its clean twin judged and the leak's "
        "holder named, the incident replayed by the training command: one line each, exit 1 "
        "if any fails. With --cuda, the CUDA half too where a GPU is visible.",
    )
    check.add_argument("--cuda", action="store_true", help="run the CUDA half too")
    return parser


def _history_commands(commands: Any) -> None:
    """``history``, ``bisect`` and the step ``git bisect run`` runs (not listed)."""
    history = commands.add_parser(
        "history",
        help="one markdown page of a history: a chart per test across commits, what moved",
        description="Read a history (pytest --memreport-history, leakgate gate --history) as "
        "series, one per test, machine fingerprint and metric, and write one page: the series "
        "that stepped or crept, each step at its commit, then a Mermaid chart of each series' "
        "peak and growth across its last commits.",
    )
    history.add_argument("history", metavar="DIR", help="the history: a folder or a pyarrow URI")
    history.add_argument("--test", metavar="PATTERN", help="tests matching a glob (or containing)")
    history.add_argument("--since", metavar="DATE|COMMIT", help="runs since a date or a commit")
    history.add_argument("--metric", metavar="M", help="one metric (allocated, reserved, rss)")
    history.add_argument("-o", "--output", metavar="PAGE.md", help="the page (default: stdout)")
    bisect = commands.add_parser(
        "bisect",
        usage="leakgate bisect [-h] [--history DIR] [--max-no-verdict N] GOOD BAD -- COMMAND ...",
        help="the first commit whose test fails its memory verdict (git bisect run)",
        description="Run git bisect between GOOD and BAD with the test command's memory "
        "verdict: FAIL marks a commit bad, PASS good, ERROR or no verdict skips it. Prints the "
        "first bad commit with its holder line. With --history, the commits the history already "
        "judged on this machine narrow the range first.",
    )
    bisect.add_argument("good", metavar="GOOD")
    bisect.add_argument("bad", metavar="BAD")
    bisect.add_argument("--history", metavar="DIR", help="a history to narrow the range with")
    bisect.add_argument(
        "--max-no-verdict",
        type=_count,
        metavar="N",
        dest="max_silent",
        help="stop after N commits in a row without a verdict (default 3)",
    )
    bisect.set_defaults(test_command=[])  # what follows --, split off by main
    step = commands.add_parser("bisect-step")
    step.add_argument("--state", type=Path, required=True)
    step.add_argument("--driver", type=int)
    step.set_defaults(test_command=[])


def _tolerance_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tolerance",
        type=_percent,
        default=DEFAULT_TOLERANCE,
        metavar="PCT",
        help=f"growth allowed, in percent of the base (default {DEFAULT_TOLERANCE * 100:.0f}%%)",
    )
    parser.add_argument(
        "--min-bytes",
        type=_size,
        default=DEFAULT_MIN_BYTES,
        metavar="SIZE",
        help="growth always allowed: the noise floor (default 1MiB)",
    )


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
    from harness.frontends.selfcheck import main as selfcheck

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
    from harness.history.archive import open_history
    from harness.history.page import render_page, since_time, write_page
    from harness.history.series import Selection

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
    from harness.history.bisect import bisect

    return bisect(args.good, args.bad, args.test_command, args.history, args.max_silent)


def _bisect_step(args: argparse.Namespace) -> int:
    """One commit for ``git bisect run``: never 2, which git would read as bad."""
    from harness.history.bisect import SKIP, step

    try:
        return step(args.test_command, args.state, args.driver)
    except (LeakgateError, OSError) as exc:
        print(f"leakgate bisect: skipped ({one_line(exc)})", file=sys.stderr)
        return SKIP


def _merge(args: argparse.Namespace) -> int:
    """Merge the rank timelines; ``--name`` and ``--world-size`` are checked before anything is
    read, and no output may replace an input (:func:`~harness.results.merge.merge_timelines`)."""
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


def _creep(text: str) -> CreepLimit:
    """``--max-creep``: PCT/RUNS."""
    try:
        return CreepLimit.parse(text)
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _percent(text: str) -> float:
    """``10%`` or ``10``: ten percent, as the fraction 0.1."""
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage like 10%, got {text!r}") from None
    if not (value >= 0 and value < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a percentage >= 0, got {text!r}")
    return value / 100


def _size(text: str) -> int:
    """``--min-bytes``: a size in bytes."""
    return _parse_size(text, "--min-bytes")


def _size_text(flag: str) -> Callable[[str], str]:
    """A size rule's option: the text as given (``50MB``), once it reads as a size."""

    def check(text: str) -> str:
        _parse_size(text, flag)
        return text

    return check


def _parse_size(text: str, what: str) -> int:
    try:
        return parse_size(text, what=what)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count(text: str) -> int:
    """A whole number of batches or epochs, at most 2**63."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {_clip(text)}") from None
    if abs(value) > INT64_BOUND:
        raise argparse.ArgumentTypeError(f"{_clip(text)} is too large")
    return value


def _clip(text: str) -> str:
    return repr(text) if len(text) <= 40 else repr(text[:30] + "...")

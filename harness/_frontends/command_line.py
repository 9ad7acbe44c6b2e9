"""``leakgate``'s parser: each command's arguments, added by a function of its own in the order
``--help`` lists them, and the types that read an argument (a percentage, a size, a count,
PCT/RUNS), a value they refuse a usage error (exit 2). :mod:`harness._frontends.cli` runs the
commands."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TypeAlias

from harness._core.errors import BadInput
from harness._core.units import parse_size
from harness._history.creep import DEFAULT_CREEP, CreepLimit
from harness._results.artifacts import DEFAULT_MIN_BYTES, DEFAULT_TOLERANCE
from harness._timeline.jsonl import INT64_BOUND
from harness._verdict.options import judged_options

Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""The subcommands of the ``leakgate`` parser, each added to it by one function here."""


def build_parser() -> argparse.ArgumentParser:
    """The ``leakgate`` parser, with every command."""
    parser = argparse.ArgumentParser(
        prog="leakgate",
        description="leakgate: memory reports and verdict comparison.",
        epilog="exit codes: 0 pass, 1 fail or regression, 2 bad input",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (
        _report_command,
        _compare_command,
        _index_command,
        _gate_command,
        _history_command,
        _bisect_command,
        _merge_command,
        _selfcheck_command,
    ):
        add(commands)
    return parser


def _report_command(commands: Commands) -> None:
    """``report``: a timeline judged again, the rules' options overriding its stored ones."""
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
    _rule_options(report)


def _rule_options(parser: argparse.ArgumentParser) -> None:
    """An option for each rule a timeline is judged by (:func:`judged_options`)."""
    for option in judged_options():
        kind = option.metadata["kind"]
        flag = "--" + option.name.replace("_", "-")
        text = option.metadata["help"].replace("%", "%%")
        if kind == "phases":
            parser.add_argument(flag, action="append", help=f"{text} (repeatable)")
        elif kind == "flag":
            parser.add_argument(flag, action="store_const", const=True, help=text)
        else:
            parser.add_argument(
                flag,
                type={"count": _count, "size": _size_text(flag)}.get(kind, str),
                metavar={"count": "N", "size": "SIZE"}.get(kind, "NAME"),
                help=text,
            )


def _compare_command(commands: Commands) -> None:
    """``compare``: two verdicts, by the gate's tolerance."""
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


def _index_command(commands: Commands) -> None:
    """``index``: a folder's index, no baseline compared."""
    index = commands.add_parser(
        "index", help="rewrite DIR/index.md from the verdicts in DIR (no baseline compared)"
    )
    index.add_argument("directory", type=Path, metavar="DIR")


def _gate_command(commands: Commands) -> None:
    """``gate``: a folder's verdicts against a baseline, and against a history's creep."""
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


def _tolerance_options(parser: argparse.ArgumentParser) -> None:
    """``--tolerance`` and ``--min-bytes``: the growth a comparison allows."""
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


def _history_command(commands: Commands) -> None:
    """``history``: one page of a history's series."""
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


def _bisect_command(commands: Commands) -> None:
    """``bisect``, and the step ``git bisect run`` runs (``bisect-step``, not listed); the test
    command after their ``--`` is split off by :func:`harness._frontends.cli.main`."""
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
    bisect.set_defaults(test_command=[])
    step = commands.add_parser("bisect-step")
    step.add_argument("--state", type=Path, required=True)
    step.add_argument("--driver", type=int)
    step.set_defaults(test_command=[])


def _merge_command(commands: Commands) -> None:
    """``merge``: a distributed run's rank timelines into one verdict and report."""
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


def _selfcheck_command(commands: Commands) -> None:
    """``selfcheck``: the measuring path proved on this machine."""
    check = commands.add_parser(
        "selfcheck",
        help="prove the measuring path on this machine, in minutes",
        description="A known allocation read, a leak and its clean twin judged and the leak's "
        "holder named, the incident replayed by the training command: one line each, exit 1 "
        "if any fails. With --cuda, the CUDA half too where a GPU is visible.",
    )
    check.add_argument("--cuda", action="store_true", help="run the CUDA half too")


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

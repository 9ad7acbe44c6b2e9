"""pytest plugin: the ``memtrace`` fixture, the ``memleak`` marker and ``--memreport``.

A test marked ``@pytest.mark.memleak(...)`` (or using ``memtrace``) gets a :class:`Recorder`
that samples ``TEST_START`` and, after the test body returns, a collected ``TEST_END``; the
test's own checkpoints fall between. The marker's rules, over defaults from the ``memleak_*``
ini options, are judged on every run; a FAIL verdict fails the test with its findings and
checkpoint table. ``--memreport[=DIR]`` also writes ``DIR/<test>.jsonl`` (the timeline, as it
is recorded), ``DIR/<test>.json`` (the verdict) and ``DIR/<test>.md`` (the report), and at the
end of the session ``DIR/index.md``, one row per test traced in that session. Verdicts travel
as user properties, so JUnit XML and pytest-xdist's controller see them.

Importing this module does not import torch: tests that never trace pay nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

import harness._core.labels as labels
from harness._core.errors import BadInput, Raised, as_unwritable
from harness._core.fsio import make_folders
from harness._core.naming import safe_name
from harness._frontends.session_options import add_session_options
from harness._verdict.options import options, parse_option, size_fields

if TYPE_CHECKING:
    from harness._frontends.session_options import SessionOptions
    from harness._recorder import Recorder
    from harness._report.index import GateDecision
    from harness._verdict.model import Verdict
    from harness._verdict.options import Rules

DEFAULT_DIR = "reports"
MEMREPORT_ENV = "LEAKGATE_MEMREPORT"
PLUGIN_NAME = "leakgate-state"
PROPERTY = "leakgate"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("leakgate", "memory-leak checks")
    group.addoption(
        "--memreport",
        nargs="?",
        const=DEFAULT_DIR,
        default=None,
        metavar="DIR",
        help=f"write each traced test's timeline, verdict and report, and an index.md, under DIR "
        f"(default {DEFAULT_DIR}/); "
        "write it as --memreport=DIR when test paths follow",
    )
    group.addoption(
        "--memreport-explain",
        action="store_true",
        default=False,
        help="the dearer search: note the line that allocated every tensor and Python object "
        "while a traced test runs, and name it in failure messages (slower tests)",
    )
    group.addoption(
        "--memreport-snapshot",
        action="store_true",
        default=False,
        help="on CUDA, record the allocator's history while each traced test runs and, for a "
        "failing leak, OOM or teardown, write <test>.snapshot.pickle beside its report (for "
        "pytorch.org/memory_viz); nothing without a CUDA device",
    )
    add_session_options(group)
    for option in options():
        parser.addini(f"memleak_{option.name}", option.metadata["help"], default=None)


def pytest_configure(config: pytest.Config) -> None:
    keywords = ", ".join(f"{o.name}={o.default!r}" for o in options())
    config.addinivalue_line(
        "markers",
        f"memleak({keywords}, **registered_rules): judge the test's memory timeline (leakgate)",
    )
    config.pluginmanager.register(LeakGate(config), PLUGIN_NAME)


@pytest.fixture
def memtrace(request: pytest.FixtureRequest) -> Iterator[Recorder]:
    """A :class:`harness.Recorder` bound to this test; its timeline is judged when it ends."""
    plugin = cast(LeakGate, request.config.pluginmanager.get_plugin(PLUGIN_NAME))
    trace = plugin.start(request.node)
    try:
        yield trace.recorder
    finally:
        trace.recorder.close()


@pytest.fixture(autouse=True)
def _memleak_marker(request: pytest.FixtureRequest) -> None:
    """Trace every test that carries the ``memleak`` marker, with or without ``memtrace``."""
    if request.node.get_closest_marker("memleak") is not None:
        request.getfixturevalue("memtrace")


@dataclass
class Trace:
    """One traced test: its recorder, rules and where its files go."""

    recorder: Recorder
    rules: Rules
    files: Path | None
    holders: tuple[str, ...] = ()
    judged: bool = False
    native: Any = None  # attribution.native.Native: native lines, under explain with memray
    snapshot: bool = False  # record the CUDA allocator's history (--memreport-snapshot)
    history: dict[str, Any] | None = None  # the snapshot taken as the call ended


@dataclass
class TestOutcome:
    """What the terminal summary lists for one traced test. The process that judged the test
    keeps it as it is; its JSON (:meth:`to_json`) is the test's ``leakgate`` property, which
    JUnit XML shows and pytest-xdist carries from a worker to the controller."""

    nodeid: str
    status: str
    worst_growth: float | None
    findings: list[str]
    phases: list[dict[str, Any]]
    history: dict[str, Any] | None = None  # its history row's summary (--memreport-history)

    def to_json(self) -> str:
        """The test's ``leakgate`` property: its status, phases, worst growth and findings."""
        fields = ("status", "phases", "worst_growth", "findings", "history")
        return json.dumps({name: getattr(self, name) for name in fields})

    @classmethod
    def from_json(cls, nodeid: str, text: str) -> TestOutcome:
        """The outcome a worker's ``leakgate`` property carries."""
        data = json.loads(text)
        return cls(
            nodeid,
            data["status"],
            data["worst_growth"],
            data["findings"],
            data.get("phases", []),
            data.get("history"),
        )


class LeakGate:
    """Plugin state: traces of running tests and the outcomes reported so far."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.session = _session_options(config)
        self.directory = self.session.directory
        self.traces: dict[str, Trace] = {}
        self.started = time.time()
        self.outcomes: list[TestOutcome] = []
        self.write_error: str | None = None
        self.environ = os.environ.get(MEMREPORT_ENV)
        if (
            self.directory is not None
        ):  # where run_ranks inside a test writes (harness._frontends.spawn)
            os.environ[MEMREPORT_ENV] = str(self.directory.resolve())
        self.session_lines: list[str] = []
        self.decision: GateDecision | None = None
        self.snapshot_note: str | None = None
        self.untracked: list[str] = []  # explained tests whose native lines memray could not note

    def rules_for(self, item: pytest.Item) -> Rules:
        """The marker's rules over the ``memleak_*`` ini defaults; keywords naming a
        registered rule become its option. A bad value is a usage error naming the test."""
        from harness._rules.registry import is_custom
        from harness._verdict.options import Rules

        values: dict[str, Any] = {}
        custom: dict[str, Any] = {}
        written: dict[str, str] = {}  # the ini's sizes as written, parsed once here
        try:
            for option in options():
                raw = self.config.getini(f"memleak_{option.name}")
                if raw:
                    values[option.name] = parse_option(option.name, raw)
                    if option.name in size_fields():
                        written[option.name] = " ".join(raw.split())
            marker = item.get_closest_marker("memleak")
            if marker is not None:
                if marker.args:
                    raise BadInput("takes keyword arguments only, not positional ones")
                for key, value in marker.kwargs.items():
                    (custom if is_custom(key) else values)[key] = value
                    written.pop(key, None)
            if written:
                values.setdefault("written", written)
            return Rules.from_dict({**values, "custom": custom} if custom else values)
        except ValueError as exc:
            raise pytest.UsageError(f"{item.nodeid}: memleak: {exc}") from None

    def start(self, item: pytest.Item) -> Trace:
        from harness._attribution.phase import PhaseAttribution
        from harness._recorder import Recorder

        rules = self.rules_for(item)
        explain = rules.explain or bool(self.config.getoption("memreport_explain", False))
        files = self.files_for(item)
        # Always ready to name holders while they live: at the checkpoint where a phase's growth
        # first crosses its budget, or an OOM. attribute=True also names them at every END.
        attribution = PhaseAttribution.for_rules(rules, explain=explain)
        meta = {"test": item.nodeid}
        try:
            recorder = Recorder(
                timeline=files.with_suffix(".jsonl") if files else None,
                meta=meta,
                rules=rules,
                attribute=attribution,
            )
        except OSError as exc:
            self.write_failed(exc)
            files = None
            recorder = Recorder(meta=meta, rules=rules, attribute=attribution)
        self.traces[item.nodeid] = trace = Trace(recorder, rules, files)
        trace.snapshot = rules.snapshot or bool(self.config.getoption("memreport_snapshot", False))
        from harness._results.cuda_snapshot import can_record

        if trace.snapshot and self.snapshot_note is None and not can_record():
            self.snapshot_note = "no CUDA device: snapshots asked for were not recorded"
        return trace

    def files_for(self, item: pytest.Item) -> Path | None:
        """Where a test's files go (``DIR/<safe name>``), or None without ``--memreport`` or
        once the folder could not be made."""
        if self.directory is None or self.write_error is not None:
            return None
        try:
            make_folders(self.directory)
        except OSError as exc:
            self.write_failed(exc)
            return None
        return self.directory / safe_name(item.nodeid)

    def write_failed(self, error: OSError) -> None:
        """Keep the first write failure: it is reported once, and verdicts are still enforced."""
        if self.write_error is None:
            unwritable = as_unwritable(error, self.directory)
            self.write_error = f"{unwritable.path}: {unwritable.reason}"

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        """The measured window is the test's call: fixtures are set up before ``TEST_START``
        and torn down after ``TEST_END``, so they count neither for nor against the test."""
        trace = self.traces.get(item.nodeid)
        if trace is None or trace.recorder.closed:
            return (yield)
        trace.recorder.checkpoint(labels.TEST_START, phase="test", collect=True)
        error = None
        attribution = trace.recorder.attribution
        if attribution is not None and attribution.explain:
            from harness._attribution.native import Native, runs_tracker

            function, module = getattr(item, "function", None), getattr(item, "module", None)
            busy = runs_tracker(function, module)
            if busy is None:
                trace.native = Native()
            else:
                self.untracked.append(f"{item.nodeid} ({busy})")
        try:
            from harness._results.cuda_snapshot import during

            keep = partial(setattr, trace, "history")  # the snapshot taken as the call ends
            with trace.native or contextlib.nullcontext(), during(trace.snapshot, keep):
                return (yield)
        except BaseException as exc:
            error = exc
            raise
        finally:
            if not trace.recorder.closed:
                said = str(Raised.of(error)) if error is not None else None
                oom = error is not None and labels.is_oom_error(error)
                trace.recorder.checkpoint(
                    labels.TEST_END,
                    phase="test",
                    collect=True,
                    note=said and f"test raised {said}"[:300],
                    event=labels.OOM if oom else None,
                )
            if trace.native is not None and trace.native.skipped is not None:
                self.untracked.append(f"{item.nodeid} ({trace.native.skipped})")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, Any, None]:
        trace = self.traces.get(item.nodeid) if call.when == "call" else None
        verdict = None
        if trace is not None and not _skipped(call):
            verdict = self.finish(item, trace, call)
        outcome = yield
        if trace is None or verdict is None or verdict.passed:
            return
        report: pytest.TestReport = outcome.get_result()
        xfail = item.get_closest_marker("xfail")
        # a call that raised nothing reported failed under xfail: pytest's strict XPASS
        strict_xpass = xfail is not None and report.failed and call.excinfo is None
        if xfail is not None and (hasattr(report, "wasxfail") or strict_xpass):
            # An expected failure that failed its memory rules failed as expected: xfailed.
            if report.passed or strict_xpass:
                report.outcome = "skipped"
                report.wasxfail = str(xfail.kwargs.get("reason", "")) or "memory verdict"
            return
        if report.passed:
            from harness._report.terminal import failure_message

            report.outcome = "failed"
            report.longrepr = failure_message(
                verdict, trace.recorder.samples, trace.rules.metric, trace.holders
            )

    def finish(self, item: pytest.Item, trace: Trace, call: pytest.CallInfo[None]) -> Verdict:
        from harness._report.terminal import worst_growth
        from harness._results.finish import finish_run

        error = call.excinfo.value if call.excinfo is not None else None
        files = trace.files
        finished = finish_run(
            trace.recorder,
            trace.rules,
            name=files.name if files else safe_name(item.nodeid),
            error=error,
            directory=files.parent if files else None,
            title=item.nodeid,
        )
        if finished.write_error is not None:
            self.write_failed(finished.write_error)
        verdict = finished.verdict
        trace.judged = True
        from harness._attribution.findings import hint

        explained = trace.recorder.attribution is not None and trace.recorder.attribution.explain
        limit = (
            3 if (self.config.getoption("verbose", 0) or 0) > 0 else 1
        )  # one holder a finding unless -v
        trace.holders = (*finished.holder_lines(limit), *hint(finished.shares, explained))
        if trace.native is not None and trace.native.found and _leaked(verdict):
            trace.holders += tuple(f"  {line.text()}" for line in trace.native.found)
        if trace.history is not None:
            trace.holders += tuple(self.save_snapshot(trace, verdict, finished.paths.get("md")))
        from harness._results.baseline import PHASE_FIELDS

        outcome = TestOutcome(
            item.nodeid,
            verdict.status,
            worst_growth(verdict),
            [f"[{f.severity} {f.kind}] {f.message}" for f in verdict.findings]
            + ([f"[ERROR] {verdict.error}"] if verdict.error else []),
            [{k: getattr(p, k) for k in PHASE_FIELDS} for p in verdict.phases],
        )
        if self.session.history is not None:
            from harness._history.archive import history_summary
            from harness._results.artifacts import run_document

            outcome.history = {**history_summary(run_document(finished.run)), "test": item.nodeid}
        self.outcomes.append(outcome)
        item.user_properties.append((PROPERTY, outcome.to_json()))
        return verdict

    def save_snapshot(self, trace: Trace, verdict: Verdict, report: Path | None) -> list[str]:
        """Keep the test's snapshot when its verdict failed for a leak, an OOM or a teardown
        residue (:func:`harness._results.cuda_snapshot.keep`); the lines for its failure message."""
        from harness._results.cuda_snapshot import keep

        history, trace.history = trace.history, None
        try:
            return keep(history, verdict, trace.files, report)
        except OSError as exc:
            self.write_failed(exc)
            return []

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        trace = self.traces.pop(item.nodeid, None)
        if trace is None:
            return
        trace.recorder.close()
        timeline = trace.recorder.timeline_path
        if not trace.judged and timeline is not None:
            # Skipped, or stopped in set-up: no verdict will follow, and a timeline without
            # one would read as a killed run to the gate.
            timeline.unlink(missing_ok=True)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Under pytest-xdist, the controller's outcomes: each a worker's test's property (a
        test judged in this process is in :attr:`outcomes` already)."""
        if not hasattr(report, "node") or report.when != "call":
            return  # ``node``: the worker xdist says a report came from
        for name, value in report.user_properties:
            if name == PROPERTY and isinstance(value, str):
                self.outcomes.append(TestOutcome.from_json(report.nodeid, value))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Index this session's reports, once, in the process that saw every test: the
        controller under pytest-xdist (workers have ``workerinput``); then compare, save and
        summarise the session's verdicts, as asked, failing the session on a regression."""
        if self.session.ends and not hasattr(self.config, "workerinput"):
            from harness._results.baseline import close_session

            closed = close_session(
                self.outcomes,
                self.directory,
                self.session.compare,
                self.session.save,
                self.session.json,
            )
            self.session_lines, self.decision = closed.lines, closed.decision
            if closed.failed and session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if self.session.history is not None and not hasattr(self.config, "workerinput"):
            from harness._history.gating import append_session

            summaries = [o.history for o in self.outcomes if o.history is not None]
            self.session_lines.append(append_session(self.session.history, summaries))
        if self.directory is None or hasattr(self.config, "workerinput"):
            return
        if self.directory.is_dir():
            from harness._results.artifacts import write_index

            try:
                write_index(self.directory, since=self.started, decision=self.decision)
            except OSError as exc:
                self.write_failed(exc)

    def pytest_unconfigure(self) -> None:
        if self.environ is None:
            os.environ.pop(MEMREPORT_ENV, None)
        else:
            os.environ[MEMREPORT_ENV] = self.environ

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        if self.write_error is not None:
            tr.write_line(
                f"leakgate warning: reports were not all written ({self.write_error}); "
                "every verdict was still enforced",
                yellow=True,
            )
        if self.snapshot_note is not None:
            tr.write_line(f"leakgate note: {self.snapshot_note}")
        if self.untracked:
            shown = "; ".join(self.untracked[:3]) + ("; ..." if len(self.untracked) > 3 else "")
            tr.write_line(
                f"leakgate note: explain noted no native lines for {len(self.untracked)} "
                f"test(s), each for the reason given: {shown}"
            )
        for line in self.session_lines:
            tr.write_line(line, red=line.startswith("leakgate REGRESSION"))
        if not self.outcomes:
            return
        from harness._core.units import format_size

        tr.write_sep("=", "leakgate memory verdicts")
        for o in sorted(self.outcomes, key=lambda o: o.nodeid):
            growth = format_size(o.worst_growth, signed=True) if o.worst_growth is not None else "-"
            tr.write_line(f"{o.status:<5} {growth:>10}  {o.nodeid}")
            for finding in o.findings:
                tr.write_line(f"      {finding}")
        if self.directory is not None:
            tr.write_line(f"reports in {self.directory}/, index: {self.directory / 'index.md'}")


def _session_options(config: pytest.Config) -> SessionOptions:
    """The report folder, baseline and summary options, checked before any test runs (a usage
    error, one line)."""
    from harness._frontends.session_options import read_session_options

    try:
        return read_session_options(config)
    except BadInput as exc:
        raise pytest.UsageError(f"leakgate: {exc}") from None


def _skipped(call: pytest.CallInfo) -> bool:
    return call.excinfo is not None and call.excinfo.errisinstance(pytest.skip.Exception)


def _leaked(verdict: Verdict) -> bool:
    from harness._attribution.findings import EXPLAINED

    return any(f.kind in EXPLAINED and f.blocking for f in verdict.findings)

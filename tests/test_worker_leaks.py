"""The children's rules on real DataLoader workers and subprocesses: a leak that lives in a
worker fails naming it, its clean twin passes, copy-on-read is its own kind, restarts and
deaths are not drops."""

from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from torch.utils.data import DataLoader, Dataset
from workload import PythonObjects, WorkerCache

from harness.recorder import Recorder
from harness.rules import Rules, judge
from harness.sample import Sample
from harness.verdict import Kind

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/self/smaps_rollup"), reason="needs Linux /proc"
)

BATCHES = 240
RULES = Rules(phase="validation", max_growth="4MB", warmup=5)
"""The issue's marker: workers' growth is judged without any new argument."""


@pytest.fixture(autouse=True)
def no_workers_of_earlier_tests():
    """Earlier tests' unreferenced loaders shut their workers down first (see test_children)."""
    gc.collect()


def validate(rec: Recorder, batches, epoch: int = 0) -> None:
    """One validation phase: a checkpoint per batch, a collected one after the loop."""
    with rec.phase("validation", epoch=epoch):
        for batch, _ in enumerate(batches):
            rec.checkpoint("VALIDATION_BATCH", batch=batch)
        rec.checkpoint("AFTER_VALIDATION", collect=True)


def loader(data: Dataset, method: str = "fork", **options) -> DataLoader:
    return DataLoader(
        data, batch_size=None, num_workers=2, multiprocessing_context=method, **options
    )


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_worker_cache_fails_naming_the_worker(method):
    """Worker 0 keeps what it makes, worker 1 (the clean twin) nothing. Spawned workers import
    torch: this is the one spawn test (about 14 s on 2 busy cores)."""
    with Recorder("cpu", rules=RULES) as rec:
        validate(rec, loader(WorkerCache(leaky=(0,)), method))
    verdict = judge(rec.samples, RULES)
    assert verdict.status == "FAIL"
    (finding,) = verdict.findings
    assert finding.kind == Kind.CHILD_LEAK and finding.severity == "P0"
    assert "worker 0 +" in finding.message and "worker 1" not in finding.message
    assert 6 << 20 < finding.bytes < 9 << 20  # 120 items of 64 KiB, less warm-up
    assert finding.evidence[-1].metric == "child_uss:worker 0"
    judged = {c.scope: c.status for c in verdict.checks if c.rule == "max_child_growth"}
    assert judged["validation epoch 0, worker 1"] == "PASS"
    assert judge(rec.samples, Rules(**{**RULES.to_dict(), "children": False})).passed


def test_the_clean_twin_passes():
    with Recorder("cpu", rules=RULES) as rec:
        validate(rec, loader(WorkerCache(leaky=())))
    verdict = judge(rec.samples, RULES)
    assert verdict.passed, verdict.findings
    judged = {c.scope: c.status for c in verdict.checks if c.rule == "max_child_growth"}
    for name in ("worker 0", "worker 1", "all children"):  # and any helper a start method runs
        assert judged[f"validation epoch 0, {name}"] == "PASS"


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "restarted"])
def test_workers_over_epochs(persistent):
    """Two epochs: a persistent worker keeps its cache, a restarted one starts over; either
    way every epoch's growth is judged and the restart is no drop."""
    rules = Rules(phase="validation", max_growth="4MB")
    for leaky, expected in (((), "PASS"), ((1,), "FAIL")):
        gc.collect()
        batches = loader(WorkerCache(leaky=leaky, data=range(160)), persistent_workers=persistent)
        with Recorder("cpu") as rec:
            for epoch in range(2):
                validate(rec, batches, epoch)
        del batches
        verdict = judge(rec.samples, rules)
        assert verdict.status == expected, verdict.findings
        checks = [c for c in verdict.checks if c.rule == "max_child_growth"]
        assert {c.scope.split(", ")[0] for c in checks} == {
            "validation epoch 0",
            "validation epoch 1",
        }
        if leaky:
            assert "worker 1 +" in verdict.findings[0].message
            assert "2 of 2 epochs" in verdict.findings[0].message


def test_copy_on_read_is_its_own_kind():
    data = PythonObjects(2400)
    with Recorder("cpu") as rec:
        validate(
            rec, DataLoader(data, batch_size=20, num_workers=2, multiprocessing_context="fork")
        )
    warned = judge(rec.samples, Rules(phase="validation"))
    assert warned.passed
    (finding,) = warned.findings
    assert finding.kind == Kind.COPY_ON_READ and finding.severity == "P2"
    assert "worker 0" in finding.message and "worker 1" in finding.message
    assert finding.bytes > 4 << 20 and not finding.blocking
    assert judge(rec.samples, Rules(phase="validation", max_growth="2MB")).passed
    failed = judge(rec.samples, Rules(phase="validation", max_copy_on_read="2MB"))
    assert failed.status == "FAIL"
    assert [(f.kind, f.severity) for f in failed.findings] == [(Kind.COPY_ON_READ, "P1")]


def wait_dead(pid: int) -> None:
    """Until child ``pid`` has exited, left for its parent to reap."""
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        time.sleep(0.01)


def test_a_worker_killed_mid_loop_is_no_drop():
    batches = iter(loader(WorkerCache(leaky=()), persistent_workers=False))
    victim = batches._workers[1].pid
    # torch's SIGCHLD handler would raise at any line of this thread once the worker dies
    handler = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        with Recorder("cpu") as rec, rec.phase("validation", epoch=0):
            for batch in range(BATCHES):
                if batch < 120:
                    next(batches)
                elif batch == 120:
                    os.kill(victim, signal.SIGKILL)
                    wait_dead(victim)
                rec.checkpoint("VALIDATION_BATCH", batch=batch)
        batches._shutdown_workers()
    finally:
        signal.signal(signal.SIGCHLD, handler)
    verdict = judge(rec.samples, RULES)
    assert verdict.passed, verdict.findings
    assert "worker 1" not in rec.samples[-1].processes
    growth = {c.scope: c.measured for c in verdict.checks if c.rule == "max_child_growth"}
    assert abs(growth["validation epoch 0, all children"]) < 256 << 10


CHILD = textwrap.dedent(
    """
    import mmap, sys
    kept = []
    for line in sys.stdin:
        if line.strip() == "leak":
            page = mmap.mmap(-1, 65536)
            page.write(b"\\1" * 65536)
            kept.append(page)
        print("ok", flush=True)
    """
)


@pytest.mark.parametrize("leak", [True, False], ids=["leaking", "clean"])
def test_a_subprocess_is_judged_by_role(leak):
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        with Recorder("cpu") as rec, rec.phase("validation", epoch=0):
            for batch in range(160):
                child.stdin.write("leak\n" if leak else "pass\n")
                child.stdin.flush()
                child.stdout.readline()
                rec.checkpoint("VALIDATION_BATCH", batch=batch)
    finally:
        child.stdin.close()
        child.wait()
    verdict = judge(rec.samples, RULES)
    comm = os.path.basename(sys.executable)[:15]
    if leak:
        assert verdict.status == "FAIL"
        assert f"{comm} {child.pid} +" in verdict.findings[0].message
    else:
        assert verdict.passed, verdict.findings


def test_pss_is_judged_when_asked():
    with Recorder("cpu") as rec:
        validate(rec, loader(WorkerCache(leaky=(1,))))
    verdict = judge(rec.samples, Rules(phase="validation", child_metric="pss"))
    assert verdict.status == "FAIL"
    assert verdict.findings[0].evidence[0].metric == "child_pss:worker 1"


def sample(batch: int, pid: int, uss: int, shared: int) -> Sample:
    role = "worker 0"
    return Sample(
        "VALIDATION_BATCH",
        "validation",
        0,
        batch,
        metrics={
            "allocated": 1000,
            "children_anon": uss,
            "children_uss": uss,
            "children_pss": uss,
            f"child_uss:{role}": uss,
            f"child_pss:{role}": uss,
            f"child_shared:{role}": shared,
        },
        processes=f"{role}={pid}",
    )


def test_a_restart_is_neither_a_drop_nor_a_rise():
    """A worker at 90 MiB replaced by one starting at 20 MiB (whose start-up climbs for the
    warm-up's batches), both flat after: no finding. The same with each lifetime growing
    1 MiB is one leak of about 2 MiB."""
    MiB = 1 << 20

    def run(growth: int) -> list[Sample]:
        first = [sample(b, 11, 90 * MiB + growth * b // 30, 4 * MiB) for b in range(30)]
        second = [
            sample(b, 12, (20 + min(b - 30, 5) * 4) * MiB + growth * (b - 30) // 30, 4 * MiB)
            for b in range(30, 60)
        ]
        return first + second

    assert judge(run(0), RULES).passed
    verdict = judge(run(MiB), RULES)
    (finding,) = verdict.findings
    assert finding.kind == Kind.CHILD_LEAK
    assert 1.5 * MiB < finding.bytes < 2.5 * MiB


def test_copied_pages_are_not_new_memory():
    """Private memory rising as shared memory falls, page for page: copy-on-read, no leak."""
    MiB = 1 << 20
    samples = [sample(b, 11, 10 * MiB + b * 64 << 10, 40 * MiB - b * 64 << 10) for b in range(60)]
    verdict = judge(samples, RULES)
    assert [f.kind for f in verdict.findings] == [Kind.COPY_ON_READ]


MARKED = """
import mmap

import pytest
from torch.utils.data import DataLoader, Dataset, get_worker_info


class Cache(Dataset):
    def __init__(self):
        self.kept = []

    def __len__(self):
        return 240

    def __getitem__(self, index):
        if get_worker_info().id == 0:
            item = mmap.mmap(-1, 65536, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            item.write(b"\\1" * 65536)
            self.kept.append(item)
        return index


@pytest.mark.memleak(phase="validation", max_growth="4MB", warmup=5{extra})
def test_workers(memtrace):
    loader = DataLoader(Cache(), batch_size=None, num_workers=2, multiprocessing_context="fork")
    with memtrace.phase("validation", epoch=0):
        for batch, _ in enumerate(loader):
            memtrace.checkpoint("VALIDATION_BATCH", batch=batch)
"""


@pytest.mark.parametrize(
    ("extra", "ini", "outcome"),
    [
        ("", "", "failed"),
        (", children=False", "", "passed"),
        ("", "memleak_children = no", "passed"),
    ],
    ids=["default", "marker-off", "ini-off"],
)
def test_the_marker_judges_workers_by_default(pytester, extra, ini, outcome):
    pytester.makepyfile(test_marked=MARKED.replace("{extra}", extra))
    pytester.makeini(f"[pytest]\n{ini}\n")
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(**{outcome: 1})
    if outcome == "failed":
        result.stdout.fnmatch_lines(
            [
                "*[[]P0 child-leak[]]*worker 0 +*max_child_growth 256KiB*",
                "*checkpoint*phase*allocated*delta*children_anon*",
            ]
        )


def test_child_options_are_checked_and_saved():
    from harness.errors import BadInput
    from harness.verdict import Finding, Verdict

    with pytest.raises(BadInput) as raised:
        Rules(child_metric="rss")
    assert raised.value.field == "Rules.child_metric"
    rules = Rules(max_child_growth="1MiB", child_metric="pss", children=False)
    over = Finding(Kind.COPY_ON_READ, "validation", 0, 5 << 20, "copied", over_budget=True)
    verdict = Verdict("FAIL", (over,), rules=rules)
    again = Verdict.from_dict(verdict.to_dict())
    assert again == verdict and again.rules.shown("max_child_growth") == "1MiB"
    assert (again.findings[0].severity, again.findings[0].blocking) == ("P1", True)
    assert Rules().shown("max_child_growth") == "256KiB"


def test_the_report_has_a_column_per_worker(tmp_path):
    from harness.finish import finish_run
    from harness.terminal import checkpoint_table

    with Recorder("cpu", rules=RULES) as rec:
        validate(rec, loader(WorkerCache(leaky=(0,))))
        finish_run(rec, RULES, name="workers", directory=tmp_path)
    report = (tmp_path / "workers.md").read_text()
    profile = report.split("## Memory Profile")[1].split("\n## ")[0]
    assert re.search(r"checkpoint +worker 0 +worker 1 +allocated", profile)
    assert re.search(r"VALIDATION_BATCH #239: +\d+\.\dMiB +\d+\.\dMiB", profile)
    analysis = report.split("## Memory Analysis")[1].split("\n## ")[0]
    assert "| Status | worker 0 | worker 1 |" in analysis
    assert re.search(r"\| \*\*FAIL\*\* \| \+[67]\.\dMiB \| \+\d+(\.\d)?K?i?B \|", analysis)
    assert "Child processes are sampled so: anon (statm) of every live child" in analysis
    assert "the workers' total `anon`" in report
    assert "### Issue 1 (P0): Leak in a child process in validation epoch 0" in report
    assert "numpy" not in report and "caches what it makes" in report
    header = checkpoint_table(rec.samples, "allocated")[0].split()
    assert header == ["checkpoint", "phase", "allocated", "delta", "children_anon"]


def test_growth_spread_over_workers_names_each_one():
    """Two workers growing 160 KiB each: within the budget one by one, over it together."""
    samples = []
    for b in range(60):
        uss = (8 << 20) + b * (160 << 10) // 60
        metrics = {"allocated": 1000, "children_uss": 2 * uss, "children_pss": 2 * uss}
        for role in ("worker 0", "worker 1"):
            metrics.update({f"child_uss:{role}": uss, f"child_shared:{role}": 4 << 20})
        samples.append(
            Sample(
                "VALIDATION_BATCH",
                "validation",
                0,
                b,
                metrics=metrics,
                processes="worker 0=11,worker 1=12",
            )
        )
    (finding,) = judge(samples, RULES).findings
    assert re.search(r"all children \+\d+.*\(worker 0 \+\d+.*, worker 1 \+\d+", finding.message)

"""harness._measure.children: the memory of live descendants, by role, read from real DataLoader
workers and subprocesses."""

from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from torch.utils.data import DataLoader
from workload import PythonObjects, WorkerCache

import harness._measure.worker_roles as roles_module
from harness._measure import children, procfs
from harness._measure.children import ChildrenReader, ProcessMemory, TreeReading
from harness._measure.procfs import read_anon, read_rollup
from harness._rules.child_growth import Growth, growth_kind, lifetimes

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/self/smaps_rollup"), reason="needs Linux /proc"
)

MiB = 1 << 20
ITEMS = 256  # 128 per worker: 8 MiB kept by a caching worker


def run(loader: DataLoader, reader: ChildrenReader, rollup: bool = True) -> list[TreeReading]:
    """One reading per batch of one epoch."""
    return [reader.read(rollup=rollup) for _ in loader]


def run_own(loader: DataLoader, reader: ChildrenReader) -> tuple[list[TreeReading], list[int]]:
    """One rollup reading per batch of one epoch, and this loader's worker pids in id order (a
    worker an earlier test left exiting may still hold the role ``worker 0``)."""
    batches = iter(loader)
    readings = [reader.read(rollup=True) for _ in batches]
    return readings, [worker.pid for worker in batches._workers]


def by_pid(readings: list[TreeReading], pid: int, field: str = "uss") -> list[int]:
    return [getattr(p, field) for r in readings for p in r.processes if p.pid == pid]


def role_of(reading: TreeReading, pid: int) -> str:
    (role,) = [p.role for p in reading.processes if p.pid == pid]
    return role


@pytest.fixture(autouse=True)
def no_workers_of_earlier_tests():
    """Shut down the workers of loaders earlier tests in this process left unreferenced, so
    this test's first loader is ``worker <id>``, not ``loader 2 worker <id>``."""
    gc.collect()


def worker_roles(reading: TreeReading) -> set[str]:
    return {p.role for p in reading.processes if re.fullmatch(r"(loader \d+ )?worker \d+", p.role)}


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_worker_cache_grows_that_workers_role_only(method):
    reader = ChildrenReader()
    loader = DataLoader(
        WorkerCache(leaky=(0,), data=range(ITEMS)),
        batch_size=None,
        num_workers=2,
        multiprocessing_context=method,
    )
    readings, (cache_pid, clean_pid) = run_own(loader, reader)
    cache_role = role_of(readings[-1], cache_pid)
    assert re.fullmatch(r"(loader \d+ )?worker 0", cache_role)
    for metric in ("heap", "uss", "anon"):
        cache = by_pid(readings, cache_pid, metric)[2:]
        clean = by_pid(readings, clean_pid, metric)[2:]
        assert cache[-1] - cache[0] > 3 * MiB
        assert abs(clean[-1] - clean[0]) < (256 << 10 if metric == "heap" else MiB)
    cache = by_pid(readings, cache_pid)[2:]
    assert growth_kind(cache, by_pid(readings, cache_pid, "shared")[2:]).kind == "private"
    metrics = readings[-1].metrics(latest=True)
    clean_role = role_of(readings[-1], clean_pid)
    assert metrics[f"child_uss:{cache_role}"] == cache[-1]
    assert metrics["children_uss"] >= cache[-1] + metrics[f"child_uss:{clean_role}"]
    assert metrics["children_pss"] == sum(p.pss for p in readings[-1].processes) > 0
    heap = by_pid(readings, cache_pid, "heap")[-1]
    assert metrics[f"child_heap:{cache_role}"] == heap
    assert metrics["children_heap"] >= heap + metrics[f"child_heap:{clean_role}"]


def test_copy_on_read_is_told_from_a_cache():
    reader = ChildrenReader()
    loader = DataLoader(
        PythonObjects(1000), batch_size=25, num_workers=2, multiprocessing_context="fork"
    )
    readings, pids = run_own(loader, reader)
    for pid in pids:
        growth = growth_kind(by_pid(readings, pid)[2:], by_pid(readings, pid, "shared")[2:])
        assert growth.kind == "copy-on-read"
        assert growth.private > 3 * MiB
        assert growth.converted > growth.private // 2
        anon = by_pid(readings, pid, "anon")[2:]
        assert anon[-1] - anon[0] < growth.private // 4  # no new pages: copies of shared ones


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "restarted"])
def test_workers_keep_their_roles_across_epochs(persistent):
    reader = ChildrenReader()
    loader = DataLoader(
        range(8),
        num_workers=2,
        persistent_workers=persistent,
        multiprocessing_context="fork",
    )
    epochs = [run(loader, reader) for _ in range(2)]
    assert [worker_roles(e[-1]) for e in epochs] == [{"worker 0", "worker 1"}] * 2
    pids = [r.pids.get("worker 0") for e in epochs for r in e]
    assert len(lifetimes(pids)) == (1 if persistent else 2)


def test_a_second_live_loader_gets_its_own_roles():
    reader = ChildrenReader()
    train = iter(DataLoader(range(4), num_workers=2, persistent_workers=True))
    next(train)
    roles = worker_roles(run(DataLoader(range(4), num_workers=2), reader)[-1])
    assert roles == {"worker 0", "worker 1", "loader 2 worker 0", "loader 2 worker 1"}
    del train


def test_loader_numbers_are_reused_once_free():
    roles = roles_module.WorkerRoles()
    roles.add(1, (101, 102))
    roles.add(2, (201,))
    roles.remove(2)
    roles.add(3, (301,))
    roles.remove(1)
    roles.add(4, (401,))
    assert [roles.roles[pid] for pid in (101, 102, 201, 301, 401)] == [
        "worker 0",
        "worker 1",
        "loader 2 worker 0",
        "loader 2 worker 0",
        "worker 0",
    ]
    roles.forget(live={101, 401})
    assert sorted(roles.roles) == [101, 301, 401]  # 102 and 201 exited; 301's loader lives


def test_a_loaders_next_iterator_made_while_the_last_lives_takes_its_roles():
    """As Lightning does each epoch: the new iterator's workers are ``worker <id>``, and the
    last one's, still alive, are named by command (no role held by two processes)."""
    reader = ChildrenReader()
    loader = DataLoader(range(8), num_workers=2, multiprocessing_context="fork")
    last = iter(loader)
    next(last)
    new = iter(loader)
    next(new)
    reading = reader.read()
    assert {role: reading.pids[role] for role in worker_roles(reading)} == {
        "worker 0": new._workers[0].pid,
        "worker 1": new._workers[1].pid,
    }
    assert reading.pids[f"pt_data_worker {last._workers[0].pid}"] == last._workers[0].pid
    del last, new


def test_only_an_iterator_over_the_same_dataset_takes_a_live_ones_number():
    roles = roles_module.WorkerRoles()
    roles.add(1, (101,), dataset=7)
    roles.add(2, (201,), dataset=8)
    roles.add(3, (301,), dataset=7)
    roles.add(4, (401,))
    assert roles.roles == {201: "loader 2 worker 0", 301: "worker 0", 401: "loader 3 worker 0"}


@pytest.fixture
def unwatched(monkeypatch):
    """torch's worker-pid hooks as torch made them, and no worker roles learned yet."""
    from torch.utils.data._utils import signal_handling

    monkeypatch.setattr(roles_module, "ROLES", roles_module.WorkerRoles())
    monkeypatch.setattr(signal_handling, "_set_worker_pids", torch._C._set_worker_pids)
    monkeypatch.setattr(signal_handling, "_remove_worker_pids", torch._C._remove_worker_pids)
    return signal_handling


def test_workers_started_before_the_reader_are_named_by_command(unwatched):
    batches = iter(DataLoader(range(4), num_workers=1, multiprocessing_context="fork"))
    next(batches)
    reader = ChildrenReader()
    assert reader.notes == []
    reading = reader.read()
    assert worker_roles(reading) == set()
    assert reading.pids[f"pt_data_worker {batches._workers[0].pid}"] == batches._workers[0].pid
    del batches


def test_a_torch_without_the_hook_is_noted(unwatched, monkeypatch):
    monkeypatch.delattr(unwatched, "_set_worker_pids")
    assert ChildrenReader().notes == [
        "DataLoader workers named by command: this torch has no _set_worker_pids"
    ]


def wait_dead(pid: int) -> None:
    """Until every thread of child ``pid`` has exited, leaving it for its parent to reap."""
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        time.sleep(0.01)


def test_a_killed_worker_is_absent_not_a_drop():
    reader = ChildrenReader()
    batches = iter(DataLoader(range(64), num_workers=2, multiprocessing_context="fork"))
    next(batches)
    before = reader.read()
    victim = before.pids["worker 1"]
    # torch's SIGCHLD handler would raise at any line of this thread once the worker dies
    handler = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        os.kill(victim, signal.SIGKILL)
        wait_dead(victim)
        after, cheap = reader.read(rollup=True), reader.read()
    finally:
        signal.signal(signal.SIGCHLD, handler)
    with pytest.raises(RuntimeError, match=str(victim)):  # torch still knows its worker's pid
        torch._C._error_if_any_worker_fails()
    for reading in (after, cheap):
        assert reading.absent == ("worker 1",)
        assert worker_roles(reading) == {"worker 0"}
        assert not [name for name in reading.metrics() if name.endswith(":worker 1")]
    assert after.metrics()["children_uss"] == sum(p.uss for p in after.processes) > 0
    del batches


CHILD = """
import subprocess, sys
kept = bytearray(32 << 20)
grandchild = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                              stdin=subprocess.PIPE)
print(grandchild.pid, flush=True)
sys.stdin.read()
grandchild.stdin.close()
grandchild.wait()
"""


def test_a_subprocess_and_its_child_are_seen_by_role():
    reader = ChildrenReader()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        grandchild = int(child.stdout.readline())
        reading = reader.read(rollup=True)
    finally:
        child.stdin.close()
        child.wait()
    comm = os.path.basename(sys.executable)[:15]  # the kernel keeps 15 bytes of the name run
    by_role = {p.role: p for p in reading.processes}
    assert by_role[f"{comm} {child.pid}"].uss > 32 * MiB
    assert by_role[f"{comm} {child.pid}"].anon > 32 * MiB
    assert by_role[f"{comm} {grandchild}"].pid == grandchild
    assert reader.read().absent == (f"{comm} {child.pid}", f"{comm} {grandchild}")


def test_no_children_reads_nothing():
    lone = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        reader = ChildrenReader(lone.pid)
        reading, cheap = reader.read(rollup=True), reader.read()
    finally:
        lone.stdin.close()
        lone.wait()
    assert reading == TreeReading(rollup=True)
    assert reading.metrics() == cheap.metrics() == {}


LONE = """
import os, subprocess, sys, threading
from harness._measure import children
from harness._measure import procfs

def listed(pid):
    raise AssertionError("listed the children files of a process without children")

if sys.argv[1] == "os.waitid":
    procfs._waitid = lambda: None  # a kernel that refused the C library's call
else:
    assert procfs._waitid() is not None  # Linux takes it
listing, procfs._children = procfs._children, listed
reader = children.ChildrenReader()
assert reader.read() == children.TreeReading() and procfs.descendants(os.getpid()) == []
procfs._children = listing
started = []
thread = threading.Thread(target=lambda: started.append(subprocess.Popen(["sleep", "30"])))
thread.start()
thread.join()
(seen,) = reader.read().processes
assert seen.pid == started[0].pid  # a child another thread started
started[0].kill()
os.waitid(os.P_PID, started[0].pid, os.WEXITED | os.WNOWAIT)
assert procfs.has_children() and reader.read().processes == ()  # exited, not reaped
started[0].wait()
assert not procfs.has_children() and reader.read().absent == (seen.role,)
"""


@pytest.mark.parametrize("waitid", ["libc", "os.waitid"])
def test_without_children_one_call_says_so_and_a_threads_child_is_seen(waitid):
    """In a process of its own, without children: nothing is listed; then a child that
    another thread started is read, and one that exited is not; through the C library's
    ``waitid`` or Python's."""
    command = [sys.executable, "-c", LONE, waitid]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_an_exited_process_has_no_rollup():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert read_rollup(child.pid) is None
    assert read_anon(child.pid) is None
    assert read_anon(os.getpid()) > 0
    uss, pss, shared = read_rollup(os.getpid())
    assert 0 < uss <= pss and shared >= 0


def test_without_proc_nothing_is_read_and_it_says_so(monkeypatch, tmp_path):
    monkeypatch.setattr(procfs, "PROC", str(tmp_path / "proc"))
    reader = ChildrenReader()
    assert reader.read() is reader.read(rollup=True) is None
    assert len(reader.notes) == 1 and "not measured" in reader.notes[0]


def test_metrics_names_each_role():
    worker = ProcessMemory("worker 0", 11, 9, heap=6, fresh=True, uss=3, pss=5, shared=7)
    command = ProcessMemory("sh 12", 12, 8, uss=1, pss=2, shared=4)
    reading = TreeReading((worker, command), absent=("worker 1",), rollup=True)
    assert reading.metrics() == {
        "children_heap": 14,
        "children_anon": 17,
        "children_uss": 4,
        "children_pss": 7,
        "child_heap:worker 0": 6,
        "child_anon:worker 0": 9,
        "child_uss:worker 0": 3,
        "child_pss:worker 0": 5,
        "child_shared:worker 0": 7,
        "child_anon:sh 12": 8,
        "child_uss:sh 12": 1,
        "child_pss:sh 12": 2,
        "child_shared:sh 12": 4,
    }
    assert reading.pids == {"worker 0": 11, "sh 12": 12}
    stale = TreeReading((ProcessMemory("worker 0", 11, None, heap=6),))
    assert stale.metrics() == {"children_heap": 6}
    assert stale.metrics(latest=True) == {"children_heap": 6, "child_heap:worker 0": 6}
    cheap = TreeReading((ProcessMemory("sh 12", 12, 9),))
    assert cheap.metrics() == {"children_heap": 9, "children_anon": 9, "child_anon:sh 12": 9}


@pytest.mark.parametrize(
    ("pids", "stretches"),
    [
        ([], []),
        ([None, None], []),
        ([5, 5, 5], [range(0, 3)]),
        ([5, 5, 9, 9, 9], [range(0, 2), range(2, 5)]),
        ([5, None, 5, 7], [range(0, 1), range(2, 3), range(3, 4)]),
    ],
)
def test_lifetimes_split_a_role_at_each_new_process(pids, stretches):
    assert lifetimes(pids) == stretches


@pytest.mark.parametrize(
    ("uss", "shared", "growth"),
    [
        ([10, 20, 30], [50, 40, 30], Growth("copy-on-read", 20, 20)),
        ([10, 20, 30], [50, 50, 50], Growth("private", 20, 0)),
        ([10, 20, 30], [50, 48, 45], Growth("private", 20, 5)),
        ([30, 20, 10], [50, 50, 60], Growth("private", -20, 0)),
        ([10], [10], Growth("private", 0, 0)),
    ],
)
def test_growth_kind(uss, shared, growth):
    assert growth_kind(uss, shared) == growth


@pytest.mark.parametrize(("uss", "shared"), [([], []), ([1, 2], [1])])
def test_growth_kind_needs_matching_series(uss, shared):
    with pytest.raises(TypeError):
        growth_kind(uss, shared)


def test_multiprocessings_resource_tracker_is_not_a_child_of_the_job():
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    tracker = resource_tracker._resource_tracker._pid
    assert tracker in procfs.descendants(os.getpid())
    reading = children.ChildrenReader().read(rollup=True)
    assert reading is not None
    assert tracker not in {p.pid for p in reading.processes}


def test_a_tracker_read_before_its_exec_is_not_a_child_of_the_job(monkeypatch):
    """Between fork and exec the tracker's command line is still this process's."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    tracker = resource_tracker._resource_tracker._pid
    ours, read = procfs.read(f"/proc/{os.getpid()}/cmdline"), procfs.read
    monkeypatch.setattr(
        procfs, "read", lambda path: ours if path == f"/proc/{tracker}/cmdline" else read(path)
    )
    reading = children.ChildrenReader().read(rollup=True)
    assert reading is not None
    assert tracker not in {p.pid for p in reading.processes}


def test_importing_the_recorder_makes_no_system_call_about_children():
    """Whether the kernel takes the C library's ``waitid`` is asked at the first reading of
    children, not when leakgate is imported."""
    code = (
        "import harness._recorder, harness._measure.procfs as p; "
        "print(p._waitid.cache_info().misses)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "0", done.stderr


def test_a_worker_role_is_read_back_from_its_text_and_a_command_is_no_worker():
    from harness._measure.worker_roles import Role

    roles = [Role(loader, worker) for loader in (1, 2, 11) for worker in (0, 7, 12)]
    assert [Role.read(role.text) for role in roles] == roles
    assert [r.text for r in sorted(roles)][:4] == [
        "worker 0",
        "worker 7",
        "worker 12",
        "loader 2 worker 0",
    ]
    assert [Role.read(t) for t in ("pt_data_worker 2", "python 1", "worker", "worker 1 ")] == [
        None
    ] * 4

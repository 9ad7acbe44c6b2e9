"""CUDA memory snapshots (``--memreport-snapshot``, ``memleak(snapshot=True)``): a no-op with one
note on the CPU, written beside the report and linked from it for a failing leak, and a real
dump that PyTorch's viewer reads on CUDA."""

import contextlib
import pickle
from types import SimpleNamespace

import pytest
import torch
from test_plugin import LOOP

from harness._frontends.plugin import safe_name
from harness._results import cuda_snapshot as snapshot

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

LEAKY = """
@pytest.mark.memleak(phase="validation", max_growth="1MB", snapshot=True)
def test_leaky(memtrace):
    loop(memtrace, keep=True)


@pytest.mark.memleak(phase="validation", max_growth="1MB")
def test_clean(memtrace):
    loop(memtrace)
"""
FAKE = {"segments": [{"blocks": []}], "device_traces": [[{"action": "alloc", "size": 512}]]}


def verdict(*kinds):
    return SimpleNamespace(findings=[SimpleNamespace(kind=k, blocking=True) for k in kinds])


def test_on_the_cpu_the_option_is_a_no_op_with_one_note(pytester, monkeypatch):
    monkeypatch.setattr(snapshot, "can_record", lambda: False)
    pytester.makepyfile(test_loop=LOOP + LEAKY)
    result = pytester.runpytest("-p", "no:randomly", "--memreport=out", "--memreport-snapshot")
    result.assert_outcomes(passed=1, failed=1)
    notes = [line for line in result.outlines if line.startswith("leakgate note:")]
    assert notes == ["leakgate note: no CUDA device: snapshots asked for were not recorded"]
    assert not list((pytester.path / "out").glob("*.pickle"))
    assert "memory snapshot" not in result.stdout.str()


def test_a_failing_leak_keeps_its_snapshot_beside_the_report_and_links_it(pytester, monkeypatch):
    recorded = []

    @contextlib.contextmanager
    def record_history(max_entries=snapshot.MAX_ENTRIES):
        recorded.append(max_entries)
        yield True

    monkeypatch.setattr(snapshot, "can_record", lambda: True)
    monkeypatch.setattr(snapshot, "record_history", record_history)
    monkeypatch.setattr(snapshot, "take", lambda: FAKE)
    pytester.makepyfile(test_loop=LOOP + LEAKY)
    result = pytester.runpytest("-p", "no:randomly", "--memreport=out")
    result.assert_outcomes(passed=1, failed=1)
    assert recorded == [snapshot.MAX_ENTRIES]  # the marker asked for test_leaky only
    name = safe_name("test_loop.py::test_leaky")
    out = pytester.path / "out"
    assert [p.name for p in out.glob("*.pickle")] == [f"{name}.snapshot.pickle"]
    assert pickle.loads((out / f"{name}.snapshot.pickle").read_bytes()) == FAKE
    report = (out / f"{name}.md").read_text()
    assert f"[{name}.snapshot.pickle]({name}.snapshot.pickle)" in report
    assert snapshot.VIEWER in report
    result.stdout.fnmatch_lines([f"*memory snapshot: out/{name}.snapshot.pickle (open it at*"])


def test_keep_writes_only_for_a_leak_oom_or_teardown(tmp_path):
    files = tmp_path / "t"
    assert snapshot.keep(FAKE, verdict("peak"), files, None) == []
    assert snapshot.keep(None, verdict("leak"), files, None) == []
    assert snapshot.keep(FAKE, verdict("oom"), None, None) == [
        "  memory snapshot: not written (give --memreport to keep it)"
    ]
    assert not list(tmp_path.iterdir())
    [line] = snapshot.keep(FAKE, verdict("teardown"), files, None)
    assert line.endswith(f"t.snapshot.pickle (open it at {snapshot.VIEWER})")
    assert pickle.loads((tmp_path / "t.snapshot.pickle").read_bytes()) == FAKE


def test_without_cuda_recording_does_nothing(monkeypatch):
    monkeypatch.setattr(snapshot, "can_record", lambda: False)
    with snapshot.record_history() as recording:
        assert recording is False


@pytest.mark.cuda
@needs_gpu
def test_a_real_snapshot_is_written_and_read_back(pytester):
    pytester.makepyfile(
        test_loop=LOOP.replace("torch.ones(size)", "torch.ones(size, device='cuda')") + LEAKY
    )
    result = pytester.runpytest("-p", "no:randomly", "--memreport=out")
    result.assert_outcomes(passed=1, failed=1)
    [path] = (pytester.path / "out").glob("*.snapshot.pickle")
    data = pickle.loads(path.read_bytes())
    assert data["segments"] and sum(map(len, data["device_traces"])) > 0
    assert path.stat().st_size < 200 * 2**20

import gc
import json
import subprocess
import sys
import types

import pytest
import torch

from harness._measure import host, malloc, probes
from harness._measure.probes import CpuProbe, CudaProbe, make_probe

MiB = 2**20
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def cuda(test):
    """Mark ``test`` as a CUDA test (``-m cuda``), skipped without a GPU."""
    return pytest.mark.cuda(needs_gpu(test))


def filled(nbytes: int, device: str = "cpu") -> torch.Tensor:
    """A float32 tensor of ``nbytes`` whose pages are written, hence resident."""
    return torch.ones(nbytes // 4, device=device)


@pytest.fixture
def cpu_probe():
    """A CPU probe over a quiet heap: cycles earlier tests left are collected first, no
    collection runs during the test, and the free heap malloc kept is trimmed (a hole in it
    holds no resident pages), so nothing but the test's own tensors moves ``rss``."""
    gc.collect()
    gc.disable()
    probe = CpuProbe()
    probe.release()
    yield probe
    probe.close()
    gc.enable()


def delta(after: dict, before: dict, metric: str) -> int:
    return after[metric] - before[metric]


def test_cpu_probe_sees_a_held_64mb_tensor_in_allocated_and_rss(cpu_probe):
    cpu_probe.sample()
    before = cpu_probe.sample()
    tensor = filled(64 * MiB)
    held = cpu_probe.sample()
    assert delta(held, before, "allocated") == pytest.approx(64 * MiB, rel=0.1)
    assert delta(held, before, "rss") == pytest.approx(64 * MiB, rel=0.1)
    del tensor
    assert delta(cpu_probe.sample(), held, "allocated") == pytest.approx(-64 * MiB, rel=0.1)


def test_cpu_peak_catches_a_freed_temporary_and_resets(cpu_probe):
    cpu_probe.reset_peak()
    before = cpu_probe.sample()
    cpu_probe.reset_peak()
    temporary = filled(64 * MiB)
    del temporary
    # malloc may have served it from a free stretch of its heap rather than a fresh mapping:
    # then freeing it returns the pages to that stretch, resident until trimmed.
    cpu_probe.release()
    after = cpu_probe.sample()
    assert after["peak"] - before["rss"] == pytest.approx(64 * MiB, rel=0.1)
    assert abs(delta(after, before, "rss")) < 6 * MiB
    cpu_probe.reset_peak()
    assert cpu_probe.sample()["peak"] - after["rss"] < 6 * MiB


def vm_hwm() -> int:
    """``VmHWM`` read from ``/proc/self/status``, in bytes."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


CHILD_PEAK = """
import json, resource
from harness._measure.probes import CpuProbe
probe = CpuProbe()
probe.reset_peak()
sample = probe.sample()
hwm = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")).split()[1]
print(json.dumps({**sample, "vm_hwm": int(hwm) * 1024,
                  "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def test_cpu_peak_is_vm_hwm_below_the_floor_exec_leaves_in_getrusage():
    # A child started by vfork and exec keeps its parent's high-water mark in ru_maxrss for
    # good; resetting VmHWM does not lower it, so the child's peak must not be read from it.
    held = filled(256 * MiB)
    done = subprocess.run(
        [sys.executable, "-c", CHILD_PEAK], capture_output=True, text=True, check=True
    )
    del held
    child = json.loads(done.stdout)
    assert child["ru_maxrss"] > child["rss"] + 128 * MiB
    assert child["rss"] <= child["peak"] <= child["vm_hwm"] < child["rss"] + 6 * MiB


def test_cpu_peak_equals_vm_hwm_while_rss_is_at_its_mark(cpu_probe):
    held = filled(64 * MiB)
    cpu_probe.reset_peak()
    for _ in range(20):
        mark_before = vm_hwm()
        sample = cpu_probe.sample()
        assert sample["peak"] >= sample["rss"]
        assert mark_before <= sample["peak"] <= vm_hwm()
    del held


def test_cpu_probe_describes_itself(cpu_probe):
    assert cpu_probe.name == "cpu" and cpu_probe.primary == "allocated"
    assert cpu_probe.notes == []
    pools = {m for m in cpu_probe.sample() if m.startswith("pool_")}  # of libraries imported
    assert set(cpu_probe.sample()) - pools == set(cpu_probe.metrics)
    info = cpu_probe.describe()
    assert info["total_memory"] == cpu_probe.capacity > 0
    assert info["driver"].startswith("glibc")


def test_without_glibc_allocated_and_trim_are_unavailable(monkeypatch, fresh_allocator):
    monkeypatch.setattr(malloc, "_LIBC", None)
    probe = CpuProbe()
    try:
        metrics = probe.sample()
        assert metrics["allocated"] is None and metrics["rss"] > 0
        assert probe.primary == "rss"
        assert [n.split(":")[0] for n in probe.notes] == [
            "cpu allocated unavailable",
            "cpu malloc_trim unavailable",
        ]
        probe.release()
    finally:
        probe.close()


def test_refused_peak_reset_gives_no_peak(monkeypatch, tmp_path):
    monkeypatch.setattr(probes, "_CLEAR_REFS", str(tmp_path))
    probe = CpuProbe()
    try:
        assert probe.sample()["peak"] is None
        probe.reset_peak()
        assert len(probe.notes) == 1 and "cannot reset VmHWM" in probe.notes[0]
    finally:
        probe.close()


def test_rss_comes_from_psutil_without_proc(monkeypatch, tmp_path):
    process = types.SimpleNamespace(memory_info=lambda: types.SimpleNamespace(rss=12345))
    fake = types.SimpleNamespace(Process=lambda: process)
    monkeypatch.setattr(host, "STATM", str(tmp_path / "missing"))
    monkeypatch.setitem(sys.modules, "psutil", fake)
    with_psutil = CpuProbe()
    monkeypatch.setitem(sys.modules, "psutil", None)
    without = CpuProbe()
    try:
        missing = (
            f"cpu anon and outside unavailable: {tmp_path / 'missing'}: No such file or directory"
        )
        assert with_psutil.sample()["rss"] == 12345 and with_psutil.notes == [missing]
        assert without.sample()["rss"] is None
        assert without.notes == [
            missing,
            f"cpu rss unavailable: {tmp_path / 'missing'} cannot be read, and no psutil",
        ]
    finally:
        with_psutil.close()
        without.close()


def test_make_probe_names():
    probe = make_probe("cpu")
    assert isinstance(probe, CpuProbe) and make_probe(probe) is probe
    probe.close()
    auto = make_probe("auto")
    assert auto.name == ("cuda:0" if torch.cuda.is_available() else "cpu")
    auto.close()
    for bad in ("gpu", "cuda:x", "", 3):
        with pytest.raises(ValueError, match="unknown probe"):
            make_probe(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a GPU")
def test_cuda_probe_without_a_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match="no CUDA device"):
        make_probe("cuda")


class FakeNVMLError(Exception):
    pass


def fake_pynvml(*, init_fails=False, known=()):
    def init():
        if init_fails:
            raise FakeNVMLError("driver not loaded")

    def handle(uuid):
        if uuid not in known:
            raise FakeNVMLError("not found")
        return uuid

    module = types.SimpleNamespace(
        NVMLError=FakeNVMLError,
        nvmlInit=init,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByUUID=handle,
    )
    return module


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        (None, (None, "pynvml (nvidia-ml-py) is not installed")),
        (fake_pynvml(init_fails=True), (None, "NVML did not load (driver not loaded)")),
        (fake_pynvml(known=["GPU-1234"]), ("GPU-1234", None)),
        (fake_pynvml(known=["MIG-1234"]), ("MIG-1234", None)),
        (fake_pynvml(), (None, "NVML does not know device 1234")),
    ],
)
def test_nvml_handle_or_the_reason(monkeypatch, module, expected):
    monkeypatch.setitem(sys.modules, "pynvml", module)
    handle, note = probes._nvml_handle("1234")
    assert handle == expected[0]
    assert (note is None) if expected[1] is None else note.endswith(expected[1])


@cuda
def test_cuda_probe_sees_a_64mb_tensor():
    with pytest.raises(ValueError, match="visible devices"):
        CudaProbe(torch.cuda.device_count())
    probe = CudaProbe(0)
    assert probe.name == "cuda:0"
    assert probe.capacity == torch.cuda.get_device_properties(0).total_memory
    try:
        probe.release()
        probe.reset_peak()
        before = probe.sample()
        tensor = filled(64 * MiB, "cuda")
        held = probe.sample()
        assert delta(held, before, "allocated") == 64 * MiB
        assert delta(held, before, "reserved") >= 64 * MiB
        assert held["peak"] == held["allocated"]
        assert delta(held, before, "driver_used") >= 60 * MiB
        if not probe.notes:
            assert held["device_used"] >= held["reserved"]
        del tensor
        probe.release()
        assert probe.sample()["reserved"] == before["reserved"]
    finally:
        probe.close()


@cuda
def test_cuda_peak_is_since_the_last_reset():
    probe = CudaProbe(0)
    try:
        probe.reset_peak()
        base = probe.sample()["allocated"]
        temporary = filled(64 * MiB, "cuda")
        del temporary
        assert probe.sample()["peak"] - base == 64 * MiB
        probe.reset_peak()
        assert probe.sample()["peak"] == base
    finally:
        probe.close()


@cuda
def test_cuda_limit_is_a_real_oom_and_close_restores_it():
    probe = CudaProbe(0)
    fraction = torch.cuda.get_per_process_memory_fraction(0)
    try:
        probe.release()
        assert probe.limit(probe.sample()["reserved"] + 256 * MiB)
        kept = filled(128 * MiB, "cuda")
        with pytest.raises(torch.OutOfMemoryError):
            filled(256 * MiB, "cuda")
        del kept
        with pytest.raises(ValueError, match="exceeds"):
            probe.limit(probe.capacity + 1)
    finally:
        probe.close()
    assert torch.cuda.get_per_process_memory_fraction(0) == fraction

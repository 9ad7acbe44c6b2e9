"""What a recorder installs in torch while it reads children (the DataLoader's worker loop and
its worker-pid hooks) is put back when it closes: after a recorded test, torch's functions are
its own again."""

import types

import torch
from torch.utils.data._utils import signal_handling, worker
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

import harness._recorder  # noqa: F401
from harness import Recorder


def torch_hooks() -> tuple[object, ...]:
    return (
        signal_handling._set_worker_pids,
        signal_handling._remove_worker_pids,
        worker._worker_loop,
        _MultiProcessingDataLoaderIter.__dict__["__init__"],
    )


def torchs_own() -> bool:
    """Whether the hooks are torch's: its C functions, and the loop its module defines."""
    return (
        signal_handling._set_worker_pids is torch._C._set_worker_pids
        and signal_handling._remove_worker_pids is torch._C._remove_worker_pids
        and isinstance(worker._worker_loop, types.FunctionType)
        and worker._worker_loop.__module__ == worker.__name__
        and _MultiProcessingDataLoaderIter.__init__.__module__ == "torch.utils.data.dataloader"
    )


def test_a_recorder_wraps_torchs_hooks_while_open_and_puts_them_back():
    assert torchs_own()
    found = torch_hooks()
    with Recorder("cpu"):
        assert not torchs_own()
        with Recorder("cpu"):  # a second one's close leaves the first one's in place
            pass
        assert not torchs_own()
    assert torch_hooks() == found


def test_torch_is_as_found_after_a_recorded_test_with_workers(pytester):
    assert torchs_own()
    found = torch_hooks()
    pytester.makepyfile(
        """
        import pytest
        import torch
        from torch.utils.data import DataLoader


        @pytest.mark.memleak(phase="validation", max_growth="4MB")
        def test_loop(memtrace):
            loader = DataLoader(torch.arange(64.0), batch_size=2, num_workers=2)
            with memtrace.phase("validation", epoch=0):
                for batch, _ in enumerate(loader):
                    memtrace.checkpoint("VALIDATION_BATCH", batch=batch)
        """
    )
    result = pytester.runpytest("-p", "no:randomly", "--memreport=reports")
    result.assert_outcomes(passed=1)
    assert torch_hooks() == found

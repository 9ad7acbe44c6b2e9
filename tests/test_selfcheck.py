"""``leakgate selfcheck`` (``python -m harness._frontends.selfcheck``): its CPU half passes
here, the CUDA half skips cleanly without a GPU, and a failing check is named with a non-zero
exit."""

import pytest
import torch

from harness._frontends import cli, selfcheck

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_the_cpu_half_passes_and_the_cuda_half_says_it_was_skipped(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["selfcheck", "--cuda"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[:3]] == ["ok", "ok", "ok"]
    assert "held by _Outputs.kept" in lines[1] and "exit 1, FAIL" in lines[2]
    assert lines[3:] == ["cuda half: skipped: no CUDA device", "selfcheck: ok (3 checks)"]


def test_a_failing_check_is_named_and_exits_1(capsys, monkeypatch):
    def wrong() -> str:
        raise selfcheck.CheckFailed("allocated rose by 0 B")

    checks = [
        selfcheck.DeviceCheck("a wrong reading", wrong),
        selfcheck.DeviceCheck("fine", lambda: "yes"),
    ]
    monkeypatch.setattr(selfcheck, "cpu_checks", lambda: checks)
    assert selfcheck.selfcheck([]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("FAILED a wrong reading: CheckFailed: allocated rose by 0 B")
    assert out[1].startswith("ok     fine: yes") and out[2] == "selfcheck: FAILED: a wrong reading"


@pytest.mark.cuda
@needs_gpu
def test_the_cuda_half_passes():
    assert selfcheck.run_checks(selfcheck.cuda_checks()) == []

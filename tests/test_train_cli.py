import os
import subprocess
import sys

import pytest
import torch

from tft.data import synth
from tft.train import build_parser, main


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    return synth(tmp_path_factory.mktemp("bars") / "small.parquet", rows=1400)


def test_validation_batch_size_follows_batch_size_by_default():
    assert build_parser().parse_args(["--batch-size", "3"]).validation_batch_size is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--parquet-file", "missing.parquet"], "missing.parquet: no such file"),
        (["--device", "tpu"], "unknown device 'tpu'"),
        (["--batch-size", "0"], "batch_size must be a positive integer"),
        (["--threads", "0"], "--threads must be at least 1"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, message, small_file, capsys):
    if "--parquet-file" not in argv:
        argv = [*argv, "--parquet-file", str(small_file)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err and "Traceback" not in err


def test_trains_resumes_and_exports_int8(small_file, tmp_path, caplog):
    caplog.set_level("INFO", logger="tft.train")
    args = ["--parquet-file", str(small_file), "--hidden-size", "8", "--checkpoint-dir"]
    assert main([*args, str(tmp_path), "--epochs", "1", "--qat"]) == 0
    assert main([*args, str(tmp_path), "--epochs", "2", "--qat", "--resume"]) == 0
    epochs = [
        r.message
        for r in caplog.records
        if r.message.startswith("epoch ") and "q-risk" in r.message
    ]
    assert [e.split(":")[0] for e in epochs] == ["epoch 1/1", "epoch 2/2"]
    assert "constant-quantile baseline" in caplog.records[-2].message
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "epoch-0.pt",
        "epoch-1.pt",
        "last.pt",
        "model-int8.pt",
    ]
    state = torch.load(tmp_path / "model-int8.pt", weights_only=True)
    assert any(v.dtype == torch.int8 for v in state.values())


def test_resume_without_checkpoint_is_bad_input(small_file, tmp_path, capsys):
    argv = ["--parquet-file", str(small_file), "--checkpoint-dir", str(tmp_path), "--resume"]
    assert main(argv) == 2
    assert "last.pt" in capsys.readouterr().err


@pytest.mark.parametrize("world", [None, "2"])
def test_leave_flushes_and_exits_with_the_code_under_torchrun_or_not(world):
    """Under torchrun a rank leaves without the interpreter's teardown (``os._exit``); what it
    printed still reaches the launcher, and the exit code is kept."""
    code = "from tft.train import leave; print('verdict', end=''); leave(3)"
    env = {k: v for k, v in os.environ.items() if k != "WORLD_SIZE"}
    if world:
        env["WORLD_SIZE"] = world
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert (done.returncode, done.stdout) == (3, "verdict")

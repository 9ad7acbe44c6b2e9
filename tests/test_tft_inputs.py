"""Bad input to the tft command lines: one line on stderr and exit 2, before any work."""

import os
import tomllib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from packaging.requirements import Requirement

from tft import data
from tft import train as train_cli
from tft.model import TemporalFusionTransformer, TFTConfig
from tft.synthetic import synth, synth_bars
from tft.trainer import TrainConfig, Trainer

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bars(tmp_path_factory):
    return synth(tmp_path_factory.mktemp("bars") / "small.parquet", rows=1400)


@pytest.fixture
def no_work(monkeypatch):
    """Training or tracing that starts fails the test: bad input must be refused first."""

    def started(*args, **kwargs):
        raise AssertionError("work started on bad input")

    for name in ("train", "traced", "warm_up"):
        monkeypatch.setattr(train_cli, name, started)


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


# --- python -m tft.train --memreport ----------------------------------------------------------


def test_memreport_that_is_a_file_is_refused(bars, tmp_path, capsys, monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("data loaded before the arguments were checked")

    monkeypatch.setattr(train_cli, "load", no_load)
    report = tmp_path / "report.md"
    report.write_text("")
    assert train_cli.main(["--parquet-file", str(bars), "--memreport", str(report)]) == 2
    assert f"--memreport {report}: is not a folder" in one_line(capsys)


def test_memreport_under_a_file_is_refused(bars, tmp_path, capsys, no_work):
    blocker = tmp_path / "somefile"
    blocker.write_text("")
    target = blocker / "sub"
    assert train_cli.main(["--parquet-file", str(bars), "--memreport", str(target)]) == 2
    assert f"{blocker} is not a folder" in one_line(capsys)


def test_memreport_in_a_read_only_folder_is_refused(bars, tmp_path, capsys, no_work):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("this user may write to a read-only folder (root)")
        target = locked / "reports"
        assert train_cli.main(["--parquet-file", str(bars), "--memreport", str(target)]) == 2
        assert f"{locked} is not writable" in one_line(capsys)
    finally:
        locked.chmod(0o700)


# --- python -m tft.train --num-workers ------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num-workers", "-1"], "num_workers must be from 0 to 64, got -1"),
        (["--num-workers", "100000000"], "num_workers must be from 0 to 64, got 100000000"),
        (["--num-workers", "1.5"], "argument --num-workers: invalid int value: '1.5'"),
        (["--num-workers", "two"], "argument --num-workers: invalid int value: 'two'"),
        (["--num-workers"], "argument --num-workers: expected one argument"),
        (["--persistent-workers"], "persistent_workers needs num_workers >= 1"),
        (["--inject-fault", "worker-cache"], "needs num_workers >= 1 (--num-workers)"),
        (["--inject-fault", "worker-cache", "--num-workers", "0"], "needs num_workers >= 1"),
    ],
)
def test_bad_worker_options_exit_2_with_one_line(argv, message, bars, capsys, no_work):
    assert train_cli.main(["--parquet-file", str(bars), *argv]) == 2
    assert message in one_line(capsys)


# --- python -m tft.train --resume -------------------------------------------------------------


def model_config(hidden_size: int) -> TFTConfig:
    """The model ``tft.train`` builds for the small synthetic file."""
    return TFTConfig(hidden_size=hidden_size)


def save(path: Path, config: TFTConfig, *, qat: bool = False) -> None:
    torch.manual_seed(0)
    Trainer(TemporalFusionTransformer(config), TrainConfig(qat=qat)).save_checkpoint(path)


def garbage(path):
    path.write_bytes(bytes(range(256)) * 4)


def empty(path):
    path.write_bytes(b"")


def wrong_keys(path):
    torch.save({"weights": torch.zeros(3)}, path)


def not_a_dict(path):
    torch.save([torch.zeros(3)], path)


def another_size(path):
    save(path, model_config(hidden_size=16))


def with_qat(path):
    save(path, model_config(hidden_size=8), qat=True)


def bad_progress(path):
    save(path, model_config(hidden_size=8))
    payload = torch.load(path, weights_only=True)
    payload["state"] = {"batches": 3}
    torch.save(payload, path)


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (garbage, "not a checkpoint"),
        (empty, "empty or cut short"),
        (wrong_keys, "not a trainer checkpoint (no model,"),
        (not_a_dict, "not a trainer checkpoint (holds a list)"),
        (another_size, "(another model size?)"),
        (with_qat, "does not fit this model"),
        (bad_progress, "does not fit this trainer"),
    ],
)
def test_resume_from_a_bad_checkpoint_is_refused(make, problem, bars, tmp_path, capsys, no_work):
    last = tmp_path / "last.pt"
    make(last)
    argv = ["--parquet-file", str(bars), "--hidden-size", "8", "--checkpoint-dir", str(tmp_path)]
    assert train_cli.main([*argv, "--resume"]) == 2
    err = one_line(capsys)
    assert f"error: --resume: {last}: " in err and problem in err


def test_a_good_checkpoint_passes_the_check_and_keeps_the_random_state(tmp_path):
    last = tmp_path / "last.pt"
    save(last, model_config(hidden_size=8))
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    train_cli.check_resume(last, TrainConfig(), model_config(hidden_size=8))
    assert torch.equal(torch.rand(3), expected)


# --- python -m tft.data -----------------------------------------------------------------------


def with_times(tmp_path: Path, name: str, values: np.ndarray, unit: str) -> Path:
    table = synth_bars(rows=len(values))
    table = table.set_column(0, "ts", pa.array(values, pa.timestamp(unit, tz="UTC")))
    path = tmp_path / f"{name}.parquet"
    pq.write_table(table, path)
    return path


MINUTES = np.arange(200, dtype=np.int64) * 60


@pytest.mark.parametrize(
    ("name", "values", "unit", "problem"),
    [
        ("year_316889", MINUTES + 10**13, "s", "outside 1677-09-21..2262-04-11"),
        ("before_1677", MINUTES - 10**13, "s", "outside 1677-09-21..2262-04-11"),
        ("after_2262", MINUTES * 10**6 + 10**16, "us", "outside 1677-09-21..2262-04-11"),
        ("nat", MINUTES * 10**9 + np.iinfo(np.int64).min, "ns", "invalid timestamp (row 0)"),
    ],
)
def test_info_on_timestamps_out_of_range_exits_2(name, values, unit, problem, tmp_path, capsys):
    path = with_times(tmp_path, name, values, unit)
    assert data.main(["info", str(path)]) == 2
    err = one_line(capsys)
    assert err.startswith(f"tft.data: error: {path}: column ts") and problem in err


def test_bars_more_than_292_years_apart_split_into_two_sessions(tmp_path):
    minutes = np.arange(100, dtype=np.int64) * 60 * 10**9
    values = np.concatenate([minutes - 3 * 2**61, minutes + 3 * 2**61])  # 2**63 ns apart and more
    split = data.load(with_times(tmp_path, "wide", values, "ns"), data.WindowSpec(20, 5, 10))
    assert split.n_rows == 200
    windows = [*split.train.starts, *split.val.starts]
    assert all(start + 25 <= 100 or start >= 100 for start in windows)


def test_synth_over_an_existing_folder_exits_2(tmp_path, capsys):
    assert data.main(["synth", "--out", str(tmp_path), "--rows", "100"]) == 2
    assert f"--out {tmp_path}: is a folder" in one_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_synth_under_a_file_exits_2(tmp_path, capsys):
    blocker = tmp_path / "bars"
    blocker.write_text("")
    assert data.main(["synth", "--out", str(blocker / "x.parquet"), "--rows", "100"]) == 2
    assert f"{blocker} is not a folder" in one_line(capsys)
    assert blocker.read_text() == ""


# --- dependencies -----------------------------------------------------------------------------


def test_pyarrow_floor_excludes_the_unsafe_ipc_reader():
    """pyarrow before 14.0.1 deserialises arbitrary objects from IPC and parquet files
    (CVE-2023-47248)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (pyarrow,) = [r for r in map(Requirement, project["dependencies"]) if r.name == "pyarrow"]
    assert "14.0.0" not in pyarrow.specifier
    assert "14.0.1" in pyarrow.specifier


# --- python -m tft.train --capacity ------------------------------------------------------------


def test_a_capacity_the_process_already_exceeds_is_refused_with_both_figures(
    bars, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(train_cli, "train", lambda *a, **k: pytest.fail("training started"))
    out = tmp_path / "reports"
    argv = ["--parquet-file", str(bars), "--epochs", "1", "--capacity", "1MB"]
    assert train_cli.main([*argv, "--memreport", str(out)]) == 2
    line = one_line(capsys)
    assert line.startswith("error: --capacity 1MB: 976.6KiB is below what the process already")
    assert "MiB (rss on cpu)" in line
    assert not out.exists() or not any(out.iterdir())

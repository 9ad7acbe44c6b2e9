"""Distributed runs: rank-aware recording, the cross-rank rule, the merged verdict and report,
the gate over rank timelines, the trainer under DDP, and the TFT on two gloo ranks, through
``torchrun`` and through :func:`harness._frontends.distributed.run_ranks`.

Under ``torchrun`` the real TFT (hidden size 16) trains on a reduced synthetic file (100
training and 25 validation windows: 50 and 13 per rank), one epoch at batch size 1, one torch
thread per rank, judged by ``tft.train``'s own rules. Through the helper it takes 40 training
and 50 validation windows (20 and 25 per rank). Clean, both pass; with ``rank0-gather`` rank 0
grows by about 12 KiB a validation batch while rank 1 stays flat, and the verdict names rank 0;
with ``metric-sync-keep`` both ranks grow by about 2 KiB a batch, and no rank stands out.
"""

import atexit
import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from harness import Rules, judge, read_timeline
from harness._core.units import parse_size
from harness._frontends.cli import main as leakgate
from harness._frontends.distributed import (
    RankInfo,
    finish_ranks,
    merge_timelines,
    rank_info,
    rank_timeline,
    run_ranks,
)
from harness._measure.sample import Sample
from harness._recorder import Recorder
from harness._report.ranks import RankRun
from tft import faults
from tft.data import WindowDataset, load, synth
from tft.model import TemporalFusionTransformer, TFTConfig
from tft.train import memory_rules, warm_up
from tft.trainer import TrainConfig, Trainer, shard

KB = 2**10
HELPER_RULES = Rules(phase=("validation",), max_growth="16KiB", warmup=5, max_peak="8MiB")
"""What the helper's runs are judged by: a budget for a 20-batch validation loop per rank, and
no teardown rule (a test's window holds its warm-up, whose one-time allocations stay). Training
is not judged: torch keeps a few hundred bytes of Python objects at each of a process's first
training steps (86 KiB over this helper's 20), as much as these faults grow in validation."""
HELPER_TRAIN = 40
"""Training windows the helper's runs take (20 per rank), to keep them short."""
SYNTHETIC = Rules(phase="validation", max_growth="40KiB", warmup=5, max_peak="8MiB")
"""The rules of the synthetic timelines below, which have a validation loop only."""
ROOT = Path(__file__).resolve().parents[1]
LAUNCHER = ("--standalone", "--nproc-per-node", "2")


@pytest.fixture(scope="module")
def bars(tmp_path_factory) -> Path:
    """100 training and 25 validation windows."""
    return synth(tmp_path_factory.mktemp("bars") / "bars.parquet", rows=2000)


@pytest.fixture(scope="module")
def wide_bars(tmp_path_factory) -> Path:
    """200 training and 50 validation windows."""
    return synth(tmp_path_factory.mktemp("bars") / "wide.parquet", rows=4000)


# -- rank identity and names -------------------------------------------------------------------


def test_rank_info_reads_the_launcher_variables():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}
    assert rank_info(env) == RankInfo(1, 2, 1, None)
    assert rank_info({"LOCAL_RANK": "0", "WORLD_SIZE": "1"}) == RankInfo(0, 1, 0, None)
    assert rank_info({}) is None and rank_info({"RANK": "0"}) is None
    with pytest.raises(ValueError, match="WORLD_SIZE: expected a whole number"):
        rank_info({"RANK": "0", "WORLD_SIZE": "two"})
    with pytest.raises(ValueError, match="rank 2 is not in a world of size 2"):
        rank_info({"RANK": "2", "WORLD_SIZE": "2"})


def test_rank_timeline_adds_the_rank_once(tmp_path):
    assert rank_timeline(tmp_path / "run.jsonl", 3) == tmp_path / "run.rank3.jsonl"
    assert rank_timeline(tmp_path / "run.rank3.jsonl", 3) == tmp_path / "run.rank3.jsonl"
    assert rank_timeline(tmp_path / "run-rank3.jsonl", 3) == tmp_path / "run-rank3.jsonl"
    assert rank_timeline(tmp_path / "run.rank1.jsonl", 3) == tmp_path / "run.rank1.rank3.jsonl"


def test_recorder_writes_its_rank_into_the_header_and_its_own_timeline(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with Recorder("cpu", timeline=tmp_path / "run.jsonl") as rec:
        rec.checkpoint("x")
    assert rec.timeline_path == tmp_path / "run.rank1.jsonl"
    header = read_timeline(tmp_path / "run.rank1.jsonl").header
    assert (header["rank"], header["world_size"], header["backend"]) == (1, 2, None)
    assert not (tmp_path / "run.jsonl").exists()


def test_one_process_recorder_header_has_no_rank(tmp_path, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    with Recorder("cpu", timeline=tmp_path / "run.jsonl") as rec:
        rec.checkpoint("x")
    assert rec.timeline_path == tmp_path / "run.jsonl" and "rank" not in rec.header


def test_shard_splits_like_distributed_sampler():
    assert shard(list(range(5)), 0, 2) == ([0, 2, 4], 3)
    assert shard(list(range(5)), 1, 2) == ([1, 3, 0], 2)
    assert shard(list(range(3)), 2, 4) == ([2], 1)
    assert shard(list(range(3)), 3, 4) == ([0], 0)
    assert shard([7, 8], 0, 1) == ([7, 8], 2)


# -- judging ranks as one run (synthetic timelines) --------------------------------------------


def loop(phase: str, per_batch: int, base: int = 100 * 2**20, n: int = 30) -> list[Sample]:
    """A loop of ``n`` batches growing by ``per_batch`` bytes each, with a little noise."""
    noise = [0, 96, -64, 32, -128, 64]
    return [
        Sample("BATCH", phase, 0, b, float(b), {"allocated": base + b * per_batch + noise[b % 6]})
        for b in range(n)
    ]


def part(rank: int, samples: list[Sample], world: int = 2) -> RankRun:
    header = {"rank": rank, "world_size": world, "backend": "gloo", "run_id": f"run{rank}"}
    return RankRun(rank, header, samples, judge(samples, SYNTHETIC))


def test_one_rank_growing_while_the_others_are_flat_is_named():
    parts = [part(0, loop("validation", 2 * KB)), part(1, loop("validation", 0))]
    finished = finish_ranks(parts, SYNTHETIC, name="run")
    verdict = finished.verdict
    assert verdict.status == "FAIL"
    outliers = [f for f in verdict.findings if f.rule == "rank_outlier"]
    assert [(f.kind, f.phase) for f in outliers] == [("leak", "validation")]
    assert outliers[0].message.startswith("rank 0 of 2 stands out: validation grew")
    assert any(f.message.startswith("rank 0: leak in validation") for f in verdict.findings)
    assert not any(f.message.startswith("rank 1") for f in verdict.findings)
    assert finished.run.header["ranks"][1] == {
        "rank": 1,
        "run_id": "run1",
        "status": "PASS",
        "timeline": None,
        "host": None,
        "pid": None,
    }


def test_without_a_budget_a_rank_standing_out_by_a_mebibyte_is_named():
    unset = Rules(phase="validation", warmup=5)
    samples = [loop("validation", 64 * KB), loop("validation", 0), loop("validation", KB // 4)]
    parts = [
        RankRun(r, {"rank": r, "world_size": 3}, s, judge(s, unset)) for r, s in enumerate(samples)
    ]
    assert all(p.verdict.passed for p in parts)
    verdict = finish_ranks(parts, unset, name="run").verdict
    assert verdict.status == "FAIL"
    assert [f.message.split(" stands out")[0] for f in verdict.findings] == ["rank 0 of 3"]
    assert "(gap allowed 1.0MiB)" in verdict.findings[0].message


def test_ranks_that_grow_alike_stand_out_from_none():
    parts = [part(0, loop("validation", 0)), part(1, loop("validation", 0))]
    verdict = finish_ranks(parts, SYNTHETIC, name="run").verdict
    assert verdict.status == "PASS"
    checks = [c for c in verdict.checks if c.rule == "rank_outlier"]
    assert [c.status for c in checks] == ["PASS"] and "no rank stands out" in checks[0].details


def test_a_rank_peaking_far_above_the_others_is_a_peak_finding():
    spiky = loop("validation", 0)
    spiky[12] = Sample("BATCH", "validation", 0, 12, 12.0, {"allocated": 100 * 2**20 + 9 * 2**20})
    parts = [part(0, loop("validation", 0)), part(1, spiky)]
    verdict = finish_ranks(parts, SYNTHETIC, name="run").verdict
    outliers = [f for f in verdict.findings if f.rule == "rank_outlier"]
    assert [(f.kind, f.message[:22]) for f in outliers] == [("peak", "rank 1 of 2 stands out")]


def test_a_missing_rank_makes_the_run_an_error():
    verdict = finish_ranks([part(0, loop("validation", 0))], SYNTHETIC, name="run").verdict
    assert verdict.status == "ERROR" and verdict.error == "rank 1 of 2 left no timeline"


# -- the gate over a folder with rank timelines ------------------------------------------------


def record_ranks(folder: Path, monkeypatch, per_batch: tuple[int, int] = (0, 0)) -> list[Path]:
    """Two rank timelines, recorded in this process as ranks 0 and 1 of two."""
    paths = []
    for rank, growth in enumerate(per_batch):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        with Recorder("cpu", timeline=folder / "run.jsonl", rules=SYNTHETIC) as rec:
            rec.checkpoint("SESSION_START", phase="session")
            for s in loop("validation", growth):
                rec.samples.append(s)
                assert rec._timeline is not None
                rec._timeline.write(s)
            rec.checkpoint("SESSION_END", phase="session")
        paths.append(rec.timeline_path)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    return paths


def test_gate_counts_a_merged_run_once_and_pairs_its_rank_timelines(tmp_path, monkeypatch, capsys):
    paths = record_ranks(tmp_path, monkeypatch)
    assert [p.name for p in paths] == ["run.rank0.jsonl", "run.rank1.jsonl"]
    finished = merge_timelines(paths)
    assert finished.verdict.status == "PASS" and sorted(finished.paths) == ["json", "md"]
    doc = json.loads((tmp_path / "run.json").read_text())
    assert [r["timeline"] for r in doc["header"]["ranks"]] == ["run.rank0.jsonl", "run.rank1.jsonl"]
    assert leakgate(["gate", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "PASS  run.json" in out and "gate: PASS: 0 of 1 verdicts fail" in out

    # A later run's rank 1 beside this merged verdict: stale.
    record_ranks(tmp_path / "later", monkeypatch)
    os.replace(tmp_path / "later" / "run.rank1.jsonl", tmp_path / "run.rank1.jsonl")
    assert leakgate(["gate", str(tmp_path)]) == 1
    assert "stale verdict: run.json does not list run" in capsys.readouterr().out

    # No merged verdict at all: missing.
    (tmp_path / "run.json").unlink()
    assert leakgate(["gate", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "missing verdict: run.rank0.jsonl (rank 0) has no merged run.json" in out


def test_leakgate_merge_writes_one_report_and_rejects_a_file_that_is_not_a_timeline(
    tmp_path, monkeypatch, capsys
):
    paths = record_ranks(tmp_path, monkeypatch, per_batch=(2 * KB, 0))
    out = tmp_path / "merged"
    assert leakgate(["merge", *map(str, paths), "--name", "both", "--directory", str(out)]) == 1
    assert "rank 0 of 2 stands out" in capsys.readouterr().out
    assert "| Ranks | world size 2" in (out / "both.md").read_text()
    assert json.loads((out / "both.json").read_text())["status"] == "FAIL"

    (tmp_path / "junk.rank0.jsonl").write_text("not json\n")
    assert leakgate(["merge", str(tmp_path / "junk.rank0.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_python_m_harness_distributed_merges_rank_files(tmp_path, monkeypatch):
    record_ranks(tmp_path, monkeypatch, per_batch=(2 * KB, 0))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness._frontends.distributed",
            *map(str, sorted(tmp_path.glob("*.jsonl"))),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "memory verdict: FAIL" in done.stdout and "rank 0 of 2 stands out" in done.stdout
    report = (tmp_path / "run.md").read_text()
    assert "| Ranks | world size 2, backend n/a: rank 0 **FAIL**" in report
    assert "Growth r0" in report and "Growth r1" in report


# -- run_ranks when a rank fails -----------------------------------------------------------------


def raise_on_rank_1(recorder: Recorder) -> None:
    """A body whose rank 1 raises before its loop, after a collective both ranks take."""
    torch.distributed.barrier()
    if torch.distributed.get_rank() == 1:
        raise ValueError("bad shard")
    with recorder.phase("validation", epoch=0):
        for b in range(12):
            recorder.checkpoint("BATCH", batch=b)


def exit_on_rank_1(recorder: Recorder) -> None:
    """A body whose rank 1 dies without a word."""
    if torch.distributed.get_rank() == 1:
        os._exit(3)
    torch.distributed.barrier()


def test_a_rank_that_raises_makes_the_run_an_error_naming_it():
    """Rank 0 either finished its loop first or was stopped when rank 1 raised: the run names
    rank 1 first either way."""
    finished = run_ranks(raise_on_rank_1, 2, rules=SYNTHETIC, name="raises")
    verdict = finished.verdict
    assert verdict.status == "ERROR"
    assert verdict.error is not None
    assert verdict.error.startswith("rank 1 raised ValueError: bad shard; ")
    assert "rank 1: ValueError: bad shard" in verdict.error
    assert finished.run.header["ranks"][1]["status"] == "ERROR"


def test_a_rank_that_dies_makes_the_run_an_error_from_the_files_left(tmp_path):
    finished = run_ranks(exit_on_rank_1, 2, rules=SYNTHETIC, name="dies", directory=tmp_path)
    verdict = finished.verdict
    assert verdict.status == "ERROR"
    assert verdict.error is not None and verdict.error.startswith("rank 1 exited with code 3")
    assert sorted(p.name for p in tmp_path.glob("dies.*")) == [
        "dies.json",
        "dies.md",
        "dies.rank0.jsonl",
        "dies.rank1.jsonl",
    ]


def abort_at_exit(recorder: Recorder) -> None:
    """A clean body whose process would abort in the interpreter's teardown, as a torch rank
    sometimes does after its work is done ("terminate called without an active exception")."""
    atexit.register(os.abort)
    with recorder.phase("validation", epoch=0):
        for b in range(12):
            recorder.checkpoint("BATCH", batch=b)


def test_a_rank_that_finished_is_not_failed_by_an_abort_in_teardown():
    finished = run_ranks(abort_at_exit, 2, rules=SYNTHETIC, name="teardown")
    assert finished.verdict.status == "PASS", "\n".join(finished.lines())
    assert [r["status"] for r in finished.run.header["ranks"]] == ["PASS", "PASS"]


# -- run_ranks with DataLoader workers ---------------------------------------------------------


def validate_with_a_worker(recorder: Recorder, leaky_rank: int | None) -> None:
    """240 validation batches read by each rank's one forked worker; ``leaky_rank``'s worker
    keeps 64 KiB per item."""
    from torch.utils.data import DataLoader
    from workload import WorkerCache

    leaky = (0,) if torch.distributed.get_rank() == leaky_rank else ()
    batches = DataLoader(
        WorkerCache(leaky), batch_size=None, num_workers=1, multiprocessing_context="fork"
    )
    with recorder.phase("validation", epoch=0):
        for batch, _ in enumerate(batches):
            recorder.checkpoint("VALIDATION_BATCH", batch=batch)


@pytest.mark.slow  # two spawned ranks, 240 batches each: about 8 s on 2 busy cores
@pytest.mark.parametrize("leaky_rank", [1, None], ids=["rank-1-worker", "clean"])
def test_run_ranks_judges_each_ranks_workers(leaky_rank, tmp_path):
    """Each rank's worker is judged as that rank's; a cache in rank 1's worker fails naming
    both, and rank 0's worker beside it passes. The report has a column per rank's worker."""
    rules = Rules(phase="validation", max_growth="4MB", warmup=5)
    finished = run_ranks(
        validate_with_a_worker,
        2,
        rules=rules,
        args=(leaky_rank,),
        name="workers",
        directory=tmp_path,
    )
    verdict = finished.verdict
    shown = "\n".join(finished.lines())
    judged: dict[str, list[str]] = {}  # each worker's checks: its live heap, what is outside it
    for check in verdict.checks:
        if check.rule == "max_child_growth":
            judged.setdefault(check.scope, []).append(check.status)
    judged = {scope: ["FAIL" if "FAIL" in found else "PASS"] for scope, found in judged.items()}
    leaked = "FAIL" if leaky_rank is not None else "PASS"
    assert judged["rank 0 · validation epoch 0, worker 0"] == ["PASS"], shown
    assert judged["rank 1 · validation epoch 0, worker 0"] == [leaked], shown
    assert verdict.status == leaked, shown
    leaks = [f.message.split(" +")[0] for f in verdict.findings if f.kind == "child-leak"]
    assert leaks == (["rank 1: child-leak in validation epoch 0: worker 0"] if leaky_rank else [])
    report = (tmp_path / "workers.md").read_text()
    profile = report.split("## Memory Profile")[1].split("## ")[0]
    assert re.search(  # the ranks' readings, what fills each rank's device, then the workers
        r"checkpoint +rank 0 +rank 1 +r0 rss( / capacity)? +r1 rss( / capacity)? "
        r"(.* )?r0 worker 0 +r1 worker 0\n",
        profile,
    )
    analysis = report.split("## Memory Analysis")[1].split("## ")[0]
    lines = [line for line in analysis.splitlines() if line.startswith("|")]
    head, row = (lines[n].split(" | ")[-3:] for n in (0, 2))  # the phase's own row first
    assert head == ["r0 worker 0", "r1 worker 0", "Status |"]
    assert not row[0].endswith("MiB")  # rank 0's worker: a few KiB at most
    assert row[1].endswith("MiB") == (leaky_rank is not None)
    assert row[2] == ("**FAIL** (rank 1) |" if leaky_rank else "PASS |")
    assert "rank 0 children, rank 1 children" in report


# -- the trainer under DDP ----------------------------------------------------------------------


def ddp_invariants(recorder: Recorder) -> None:
    """On each of two ranks: validation over 9 windows (one padded) gives the one-process
    figures, and an out-of-memory error on rank 1 makes both ranks halve their batch size."""
    from workload import Windows, make_model

    from tft.model import pinball, quantile_loss

    rank = torch.distributed.get_rank()
    val = Windows(9, seed=1)
    trainer = Trainer(make_model(), TrainConfig(epochs=1, batch_size=4, device="cpu"))
    loss, q_risk = trainer._validate(val)
    model = trainer.model.eval()
    with torch.inference_mode():
        rows = [{k: v.unsqueeze(0) for k, v in val[i].items()} for i in range(len(val))]
        predictions = [model(row) for row in rows]
        targets = [row["target"] for row in rows]
        quantiles = trainer.quantiles
        expected = sum(
            float(quantile_loss(p, t, quantiles)) for p, t in zip(predictions, targets, strict=True)
        )
        pinballs = sum(
            pinball(p, t, quantiles).flatten(0, -2).sum(0)
            for p, t in zip(predictions, targets, strict=True)
        )
        scale = sum(t.abs().sum() for t in targets)
    assert loss == pytest.approx(expected / len(val), rel=1e-5)
    assert q_risk == pytest.approx((2 * pinballs / scale).tolist(), rel=1e-5)

    failed: list[int] = []

    def fail_once(label: str, *, batch: int | None = None, **_: object) -> None:
        if rank == 1 and label == "TRAIN_BATCH" and batch == 2 and not failed:
            failed.append(batch)
            raise torch.OutOfMemoryError("out of memory (emulated on rank 1)")

    trainer.callbacks += [fail_once, recorder]
    trainer.fit(Windows(32), val)
    assert (trainer.state.batch_size, trainer.state.retries) == (2, 1)


def test_ddp_trainer_reduces_validation_and_backs_off_on_every_rank():
    finished = run_ranks(ddp_invariants, 2, rules=Rules(), name="invariants")
    verdict = finished.verdict
    shown = "\n".join(finished.lines())
    assert verdict.status == "FAIL", shown  # rank 1's OOM, and nothing raised anywhere
    assert [r["status"] for r in finished.run.header["ranks"]] == ["PASS", "FAIL"]
    ooms = [f.message for f in verdict.findings if f.kind == "oom"]
    assert ooms and all(m.startswith("rank 1: ") for m in ooms), shown


# -- the TFT on two gloo ranks ------------------------------------------------------------------


def torchrun(bars: Path, folder: Path, *names: str) -> subprocess.Popen[str]:
    """``python -m tft.train`` on two gloo ranks under ``torchrun``, started (not awaited)."""
    argv = ["--parquet-file", str(bars), "--epochs", "1", "--hidden-size", "16"]
    argv += ["--memreport", str(folder)]
    argv += [arg for name in names for arg in ("--inject-fault", name)]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", *LAUNCHER, "-m", "tft.train", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**env, "OMP_NUM_THREADS": "1"},
    )


@pytest.mark.slow
def test_tft_train_under_torchrun_passes_clean_and_names_rank0_for_rank0_gather(
    wide_bars, tmp_path
):
    """On 51 validation windows: over 25 the fault grows less than the job's budget, which
    torch's own Python objects in training set (``tft/budgets.json``)."""
    bars = wide_bars
    runs = [torchrun(bars, tmp_path / "clean"), torchrun(bars, tmp_path / "leaky", "rank0-gather")]
    (clean_out, clean_err), (leaky_out, leaky_err) = [run.communicate(timeout=600) for run in runs]

    assert runs[0].returncode == 0, clean_out + clean_err[-3000:]
    assert "memory verdict: PASS" in clean_out
    doc = json.loads((tmp_path / "clean" / "tft-train-clean.json").read_text())
    assert doc["status"] == "PASS"
    assert doc["rules"]["max_growth"] == parse_size(memory_rules()["max_growth"])
    assert [(r["rank"], r["status"]) for r in doc["header"]["ranks"]] == [(0, "PASS"), (1, "PASS")]
    assert (doc["header"]["world_size"], doc["header"]["backend"]) == (2, "gloo")
    for rank in (0, 1):
        header = read_timeline(tmp_path / "clean" / f"tft-train-clean.rank{rank}.jsonl").header
        assert (header["rank"], header["world_size"], header["backend"]) == (rank, 2, "gloo")
        assert header["rules"]["written"]["max_growth"] == memory_rules()["max_growth"]
    assert leakgate(["gate", str(tmp_path / "clean")]) == 0

    assert runs[1].returncode == 1, leaky_out + leaky_err[-3000:]
    doc = json.loads((tmp_path / "leaky" / "tft-train-rank0-gather.json").read_text())
    assert doc["status"] == "FAIL"
    found = {f["rule"]: (f["phase"], f["message"]) for f in doc["findings"]}
    # rank 0's gathered batches are its validation's growth and, past max_peak, its peak too
    assert set(found) - {"max_peak"} == {"max_growth", "rank_outlier"}, found
    assert {phase for phase, _ in found.values()} == {"validation"}
    assert found["max_growth"][1].startswith("rank 0: leak in validation epoch 0")
    assert found["rank_outlier"][1].startswith("rank 0 of 2 stands out: validation grew")
    assert [r["status"] for r in doc["header"]["ranks"]] == ["FAIL", "PASS"]
    report = (tmp_path / "leaky" / "tft-train-rank0-gather.md").read_text()
    assert "rank 0      rank 1" in report and "| **FAIL** (rank 0) |" in report
    assert "held by rank 0: `FaultyRank0Gather.gathered`" in report
    named = r"\n    rank 0: held by FaultyRank0Gather\.gathered \(list, \d+ items, [\d.]+[KM]iB\)"
    assert re.search(named, leaky_out), leaky_out


def train_tft(recorder: Recorder, parquet: Path, names: tuple[str, ...]) -> None:
    """A distributed test body: the TFT on this rank's share of ``parquet`` (its first
    :data:`HELPER_TRAIN` training windows, every validation window), warmed up as ``tft.train``
    warms up, then one epoch with the faults named inside a collected ``session`` phase."""
    full = load(parquet)
    split = replace(
        full,
        train=WindowDataset(full.train.series, full.train.starts[:HELPER_TRAIN], full.train.spec),
    )
    data = split.train
    model_config = TFTConfig(
        static_cardinalities=data.static_cardinalities,
        n_observed=data.n_observed,
        n_known=data.n_known,
        encoder_length=data.spec.encoder_length,
        decoder_length=data.spec.decoder_length,
        hidden_size=16,
    )
    config = faults.configure(TrainConfig(epochs=1, device="cpu"), names)
    warm_up(faults.trainer_class(names), config, model_config, split)
    with recorder.phase("session", collect=True):
        torch.manual_seed(0)
        model = TemporalFusionTransformer(model_config)
        trainer = faults.build_trainer(model, config, [recorder], names)
        assert trainer.world_size == 2
        trainer.fit(split.train, split.val)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("names", "expected"),
    [
        ((), None),
        (("rank0-gather",), {"rank 0: leak in validation", "rank 0 of 2 stands out"}),
        (("metric-sync-keep",), {"rank 0: leak in validation", "rank 1: leak in validation"}),
    ],
    ids=["clean", "rank0-gather", "metric-sync-keep"],
)
def test_run_ranks_judges_the_tft_on_two_gloo_ranks(wide_bars, tmp_path, names, expected):
    finished = run_ranks(
        train_tft, 2, rules=HELPER_RULES, directory=tmp_path, args=(wide_bars, names), name="tft"
    )
    verdict = finished.verdict
    shown = "\n".join(finished.lines())
    if expected is None:
        assert verdict.status == "PASS", shown
    else:
        assert verdict.status == "FAIL", shown
        for start in expected:
            assert any(f.message.startswith(start) for f in verdict.findings), shown
        if "rank 0 of 2 stands out" not in expected:
            assert not any(f.rule == "rank_outlier" for f in verdict.findings), shown
    assert [p.name for p in sorted(tmp_path.glob("tft.rank*.jsonl"))] == [
        "tft.rank0.jsonl",
        "tft.rank1.jsonl",
    ]
    report = (tmp_path / "tft.md").read_text()
    assert "Growth r0" in report and "Growth r1" in report and "- Rank 1 timeline" in report

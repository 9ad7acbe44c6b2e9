"""Known faults and trainer checks: the detection matrix, and the pieces it is made of.

The matrix trains the real TFT (hidden size 32, 60 + 10 steps per window) on a reduced synthetic
file (32 training and 36 validation windows), one epoch at batch size 1, once per fault and
clean (with and without QAT), traced by a Recorder and judged by :data:`RULES`: each fault must
fail with its expected finding, the clean trainer must pass. ``reports/README.md`` lists the
growth each fault showed. ``max_growth`` sits between the two: a clean validation loop moves
1.7 to 8.1 KiB over its 31 judged batches (the heap's bookkeeping and Python's objects, given
back at its end), the smallest fault (``predictions-on-device``) grows 17 to 19 KiB. Training
is judged against its own budget (:data:`TRAINING`): torch keeps a few hundred bytes of Python
objects for each training step over its first thousand (a cache that fills ever more slowly:
12.1 KiB over steps 100 to 200, 0.8 KiB over steps 1,400 to 1,500, each after a full
collection), 13 to 22 KiB over the 27 judged batches here, while its faults grow by MiBs.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import replace
from typing import NamedTuple

import pytest
import torch
from workload import Windows
from workload import make_model as tiny_model

from harness import Recorder, Rules, judge, read_timeline
from harness._measure.sample import Sample
from harness._verdict.model import Finding, Verdict
from tft import faults, train
from tft.checks import CHECK_FAILED, watch
from tft.data import Split, WindowDataset, WindowSpec, load, synth
from tft.model import TemporalFusionTransformer, TFTConfig
from tft.train import batch_shapes, main
from tft.trainer import TrainConfig, Trainer

TRAIN_WINDOWS = 32
SPEC = WindowSpec()
CONFIG = TrainConfig(epochs=1, batch_size=1)

# row: (faults, config changes, expected (kind, phase) or None for PASS)
MATRIX: dict[str, tuple[list[str], dict[str, object], tuple[str, str] | None]] = {
    "clean": ([], {}, None),
    "clean-qat": ([], {"qat": True}, None),
    "val-attention-cache": (["val-attention-cache"], {}, ("leak", "validation")),
    "val-batch-32": (["val-batch-32"], {}, ("peak", "validation")),
    "keep-optimizer": (["keep-optimizer"], {}, ("check", "validation")),
    "param-store-ref": (["param-store-ref"], {}, ("teardown", "session")),
    "qat-lr-stale": (["qat-lr-stale"], {"qat": True}, ("check", "training")),
    "loss-accumulate": (["loss-accumulate"], {}, ("leak", "training")),
    "hook-per-epoch": (["hook-per-epoch"], {}, ("leak", "training")),
    "predictions-on-device": (["predictions-on-device"], {}, ("leak", "validation")),
}
RULES = Rules(
    phase=("validation",),
    max_growth="12KiB",
    warmup=5,
    max_peak="10MiB",
    teardown="256KiB",
)
TRAINING = replace(RULES, phase=("training",), max_growth="64KiB")
"""The rules of the training loops (see the module's docstring)."""

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, needs_gpu])]


@pytest.fixture(scope="module")
def split(tmp_path_factory) -> Split:
    full = load(synth(tmp_path_factory.mktemp("bars") / "bars.parquet", rows=2800), SPEC)
    train = WindowDataset(full.train.series, full.train.starts[:TRAIN_WINDOWS], SPEC)
    return replace(full, train=train)


def model_config(split: Split) -> TFTConfig:
    data = split.train
    return TFTConfig(
        static_cardinalities=data.static_cardinalities,
        n_observed=data.n_observed,
        n_known=data.n_known,
        encoder_length=data.spec.encoder_length,
        decoder_length=data.spec.decoder_length,
    )


def make_model(split: Split) -> TemporalFusionTransformer:
    torch.manual_seed(0)
    return TemporalFusionTransformer(model_config(split))


WARM: set[str] = set()


def warm_up(device: str, split: Split, names: list[str], config: TrainConfig) -> None:
    """What a process allocates once is no fault's: the first clean epoch on ``device`` fills
    glibc's per-thread cache of freed chunks (counted as allocated by ``mallinfo2``: about
    15 KB over the first 15 batches), and the command line's warm-up runs the row's batch
    shapes (oneDNN keeps about 330 KB for each new batch size of the model's LSTMs)."""
    if device not in WARM:
        for qat in (False, True):
            Trainer(make_model(split), TrainConfig(device=device, qat=qat)).fit(
                split.train, split.val
            )
        WARM.add(device)
    train.warm_up(faults.trainer_class(names), config, model_config(split), split)


def trace(split: Split, device: str, row: str) -> Judged:
    """Train one row of the matrix inside a collected ``session`` phase and judge it."""
    names, changes, _ = MATRIX[row]
    config = faults.configure(replace(CONFIG, device=device, **changes), names)
    warm_up(device, split, names, config)
    try:
        with Recorder(device) as rec, rec.phase("session", collect=True):
            trainer = faults.build_trainer(make_model(split), config, [rec], names)
            watch(trainer, rec)
            trainer.fit(split.train, split.val)
            del trainer
    finally:
        faults.reset()
    return Judged.of(judge(rec.samples, RULES), judge(rec.samples, TRAINING))


class Judged(NamedTuple):
    """The matrix row's status and findings, validation's and training's together."""

    status: str
    findings: tuple[Finding, ...]

    @classmethod
    def of(cls, *verdicts: Verdict) -> Judged:
        status = max((v.status for v in verdicts), key=lambda s: s.rank)
        return cls(status, tuple(f for v in verdicts for f in v.findings))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("row", list(MATRIX))
def test_detection_matrix(row, device, split):
    verdict = trace(split, device, row)
    expected = MATRIX[row][2]
    messages = [f.message for f in verdict.findings]
    if expected is None:
        assert verdict.status == "PASS", messages
    else:
        assert verdict.status == "FAIL"
        assert expected in {(f.kind, f.phase) for f in verdict.findings}, messages


def test_every_fault_has_its_row():
    assert {name for names, _, _ in MATRIX.values() for name in names} == set(faults.FAULTS)


# -- the catalogue ------------------------------------------------------------------------------


def test_unknown_fault_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown fault 'oops'.*val-attention-cache"):
        faults.get(["oops"])


def test_faults_combine_into_one_trainer():
    names = ["predictions-on-device", "val-attention-cache", "val-batch-32", "keep-optimizer"]
    cls = faults.trainer_class(names)
    assert issubclass(cls, faults.PredictionsOnDevice) and issubclass(cls, faults.KeepOptimizer)
    assert faults.trainer_class([]) is Trainer and faults.trainer_class(["val-batch-32"]) is Trainer
    config = faults.configure(TrainConfig(batch_size=2), names)
    assert (config.batch_size, config.validation_batch_size) == (2, 32)


def test_param_store_keeps_parameters_until_reset(split):
    trainer = faults.build_trainer(make_model(split), TrainConfig(), faults=["param-store-ref"])
    probe = weakref.ref(next(trainer.model.parameters()))
    del trainer
    try:
        assert probe() is not None
    finally:
        faults.reset()
    assert probe() is None


# -- checks -------------------------------------------------------------------------------------


class Sink:
    def __init__(self):
        self.calls = []

    def __call__(self, label, *, phase, epoch, batch, note):
        self.calls.append((label, phase, epoch, batch, note))


@pytest.mark.parametrize(
    ("names", "invariant", "phase"),
    [
        ([], None, None),
        (["keep-optimizer"], "optimizer-released", "validation"),
        (["qat-lr-stale"], "lr-follows-schedule", "training"),
    ],
)
def test_checks_report_each_broken_invariant_once_per_epoch(names, invariant, phase):
    sink = Sink()
    trainer = faults.build_trainer(tiny_model(), TrainConfig(epochs=2, qat=True), faults=names)
    checks = watch(trainer, sink)
    trainer.fit(Windows(6), Windows(3, seed=1))
    if invariant is None:
        assert sink.calls == [] and checks.failures == []
        return
    assert [(c[0], c[1], c[2]) for c in sink.calls] == [(CHECK_FAILED, phase, e) for e in (0, 1)]
    assert all(c[4].startswith(f"{invariant}: ") for c in sink.calls)


def test_a_failed_check_is_a_blocking_finding_of_its_phase():
    def reading(label, phase, epoch, batch=None, note=None):
        return Sample(label, phase, epoch, batch, 0.0, {"allocated": 1000}, note=note)

    samples = [reading("EPOCH_START", "training", e) for e in (0, 1)]
    samples += [reading("TRAIN_BATCH", "training", 0, b) for b in range(10)]
    samples += [
        reading(CHECK_FAILED, "validation", e, note=f"optimizer-released: held {e}") for e in (0, 1)
    ]
    verdict = judge(samples, Rules(max_growth="1KB", max_drift="1KB"))
    (finding,) = verdict.findings
    assert (finding.kind, finding.severity, finding.phase, finding.epoch) == (
        "check",
        "P1",
        "validation",
        0,
    )
    assert finding.blocking and verdict.status == "FAIL"
    assert "optimizer-released: held 0" in finding.message and "(2 failures)" in finding.message
    assert [e.epoch for e in finding.evidence] == [0, 1]
    unjudged = Rules(max_growth="1KB", max_drift="1KB", allow_unjudged=True)
    assert judge(samples[:-2], unjudged).status == "PASS"


# -- the incident, replayed through the command line --------------------------------------------


@pytest.fixture(scope="module")
def bars(tmp_path_factory):
    return synth(tmp_path_factory.mktemp("cli") / "bars.parquet", rows=2800)


def test_fault_list_and_unknown_fault(capsys):
    assert main(["--inject-fault", "list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in faults.FAULTS)
    assert main(["--inject-fault", "nope"]) == 2
    assert "unknown fault 'nope'" in capsys.readouterr().err


def test_warm_up_covers_back_off_and_partial_batches():
    assert batch_shapes(176, 32, 3) == [32, 16, 8, 4]
    assert batch_shapes(36, 32, 1) == [32, 16, 4]
    assert batch_shapes(704, 1, 3) == [1]


def resident_now() -> int:
    """The process's resident bytes after collection and a heap trim, as a collected
    checkpoint reads them."""
    with Recorder("cpu") as rec:
        return rec.checkpoint("now", collect=True).get("rss") or 0


def test_incident_replay_ooms_in_validation_and_the_clean_run_passes(bars, tmp_path, capsys):
    def run(names: list[str], capacity: int | None = None) -> tuple[int, str, dict]:
        argv = ["--parquet-file", str(bars), "--epochs", "1", "--memreport", str(tmp_path)]
        argv += [arg for name in names for arg in ("--inject-fault", name)]
        argv += ["--capacity", str(capacity)] if capacity else []
        code = main(argv)
        name = "tft-train-" + ("+".join(names) or "clean")
        return code, capsys.readouterr().out, json.loads((tmp_path / f"{name}.json").read_text())

    code, out, clean = run([])
    assert code == 0 and clean["status"] == "PASS" and "memory verdict: PASS" in out
    timeline = read_timeline(tmp_path / "tft-train-clean.jsonl")
    meta = timeline.header["meta"]
    assert meta["faults"] == [] and meta["val_samples"] == 36 and "--memreport" in meta["command"]
    assert timeline.header["config"]["validation_batch_size"] == 1
    start = timeline.samples[0].get("rss")
    highest = max(max(s.get("rss") or 0, s.get("peak") or 0) for s in timeline.samples)
    # Twice the clean run's measured rise, above wherever the process stands before each run
    # (it keeps some heap from run to run): room for the clean run, far less than the faults.
    room = 2 * (highest - start)

    code, out, failed = run(["val-attention-cache", "val-batch-32"], resident_now() + room)
    assert code == 1 and failed["status"] == "FAIL" and "memory verdict: FAIL" in out
    assert ("oom", "validation") in {(f["kind"], f["phase"]) for f in failed["findings"]}
    assert "report: " in out

    code, _, again = run([], resident_now() + room)
    assert code == 0 and again["status"] == "PASS"

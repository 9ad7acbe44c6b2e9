"""The Lightning callback on real ``lightning.Trainer`` runs: verdicts of clean and leaky
modules, phase and epoch tagging, the pytest fixture, and a script stopped by its verdict."""

from __future__ import annotations

import json
from itertools import groupby
from pathlib import Path

import pytest
import torch

L = pytest.importorskip("lightning")

from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from harness import Recorder, Rules, Sample, judge  # noqa: E402
from harness._core.errors import BadInput, UnwritableReport  # noqa: E402
from harness.integrations.lightning import (  # noqa: E402
    LeakGateCallback,
    MemoryCheckFailed,
)

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*does not have many workers:UserWarning",
    "ignore:.*smaller than the logging interval:UserWarning",
    "ignore:.*val_check_interval.*:UserWarning",
    "ignore:.*LeafSpec.*",
)

STEPS = 64  # time steps per window
VALIDATION_BATCHES = 176


class Forecaster(L.LightningModule):
    """An LSTM (hidden size 8) with self-attention over its steps and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(4, 8, batch_first=True)
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(x)
        attention = torch.softmax(h @ h.transpose(1, 2) / 8**0.5, dim=-1)
        return self.head((attention @ h)[:, -1])

    def loss(self, batch: list[torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.loss(batch)

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", self.loss(batch))

    def test_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.log("test_loss", self.loss(batch))

    def predict_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self(batch[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class LeakyValidation(Forecaster):
    """Keeps every validation prediction with its graph. Lightning validates under inference
    mode, which records no graph, so the step leaves it, as code that wants gradients of its
    predictions does (the batch is cloned: inference tensors cannot be saved for backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.predictions: list[torch.Tensor] = []

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        with torch.inference_mode(False), torch.enable_grad():
            self.predictions.append(self(batch[0].clone()))


class ClearedEachRun(LeakyValidation):
    """Keeps predictions across a validation run and clears them only after it."""

    def on_validation_epoch_end(self) -> None:
        self.predictions.clear()


class LeakyTraining(Forecaster):
    """Keeps every training loss (their graphs' nodes survive backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.losses: list[torch.Tensor] = []

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.loss(batch)
        self.losses.append(loss)
        return loss


class KeptUntilEpochEnd(LeakyTraining):
    """pytorch-forecasting 1.4.0's shape: each step's output kept in a list that only the
    epoch's end clears, so nothing holds the memory once the fit is over."""

    def on_train_epoch_end(self) -> None:
        self.losses.clear()


class LogsGraphs(Forecaster):
    """``self.log`` of tensors that carry their graph, in training and in validation."""

    def __init__(self) -> None:
        super().__init__()
        self.logged_graphs = 0

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.loss(batch)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        self.logged_graphs += loss.grad_fn is not None
        return loss

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        with torch.inference_mode(False), torch.enable_grad():
            x, y = batch
            loss = nn.functional.mse_loss(self(x.clone()), y.clone())
            self.log("val_loss", loss, on_epoch=True)
            self.logged_graphs += loss.grad_fn is not None


class FailsInTraining(Forecaster):
    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        raise ValueError("bad batch")


def loader(windows: int, seed: int) -> DataLoader:
    """``windows`` random windows of 64 steps and 4 features, one per batch."""
    g = torch.Generator().manual_seed(seed)
    data = TensorDataset(torch.randn(windows, STEPS, 4, generator=g), torch.randn(windows, 1))
    return DataLoader(data, batch_size=1)


def trainer(callback: LeakGateCallback, epochs: int = 2, **options: object) -> L.Trainer:
    """A quiet trainer on one CPU unless ``options`` say otherwise."""
    quiet = {"enable_progress_bar": False, "logger": False, "enable_checkpointing": False}
    options = {"accelerator": "cpu", "devices": 1, **quiet, **options}
    return L.Trainer(max_epochs=epochs, callbacks=[callback], enable_model_summary=False, **options)


def fit(
    module: L.LightningModule,
    callback: LeakGateCallback,
    *,
    epochs: int = 2,
    train: int = 16,
    val: int = VALIDATION_BATCHES,
    **options: object,
) -> L.Trainer:
    """Fit ``module`` on the CPU for ``epochs`` with ``train`` and ``val`` batches of one."""
    torch.manual_seed(0)
    run = trainer(callback, epochs, **options)
    run.fit(module, loader(train, 0), loader(val, 1))
    return run


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    """One short fit first: the first in a process leaves about 1 MB of one-time allocations
    (kernels, Lightning's state), which would count against the first traced session."""
    with Recorder("cpu") as recorder:
        fit(Forecaster(), LeakGateCallback(recorder), epochs=1, train=4, val=4)


def judged(module: L.LightningModule, rules: Rules, **options: object) -> LeakGateCallback:
    """Fit ``module`` under a callback that makes its own recorder and judges with ``rules``."""
    callback = LeakGateCallback(rules=rules)
    fit(module, callback, **options)
    assert callback.finished is not None
    return callback


def runs(samples: list[Sample]) -> list[tuple[str, str | None, int | None, list[int | None]]]:
    """Samples as ``(label, phase, epoch, batches)``, consecutive equal ones merged."""
    return [
        (label, phase, epoch, [s.batch for s in same])
        for (label, phase, epoch), group in groupby(samples, lambda s: (s.label, s.phase, s.epoch))
        for same in [list(group)]
    ]


# -- verdicts -----------------------------------------------------------------------------------

VALIDATION = Rules(phase=("training", "validation"), max_growth="1MB", teardown="256KB")


def test_clean_module_passes_every_rule_on_evidence():
    verdict = judged(Forecaster(), VALIDATION).finished.verdict
    assert verdict.status == "PASS", [f.message for f in verdict.findings]
    judged_groups = {(p.phase, p.epoch) for p in verdict.phases}
    assert judged_groups == {(p, e) for p in ("training", "validation") for e in (0, 1)}
    teardown = [c for c in verdict.checks if c.rule == "teardown"]
    assert [c.status for c in teardown] == ["PASS"]


def test_predictions_kept_with_their_graph_fail_in_validation():
    callback = judged(LeakyValidation(), VALIDATION)
    finished = callback.finished
    assert finished.verdict.status == "FAIL"
    leaks = finished.verdict.of_kind("leak")
    assert [(f.phase, f.rule) for f in leaks] == [("validation", "max_growth")]
    assert leaks[0].message.startswith("leak in validation epoch ")
    assert leaks[0].slope > 64 * 1024  # the graph of each prediction, not just its 4 bytes
    assert finished.holders[0].path == "LeakyValidation.predictions"


def test_a_leak_cleared_after_each_of_two_runs_per_epoch_is_caught():
    # val_check_interval=0.5: two runs of 88 batches in the epoch, one group numbered on.
    rules = Rules(phase="validation", max_growth="1MB")
    options = {"epochs": 1, "val": 88, "val_check_interval": 0.5}
    verdict = judged(ClearedEachRun(), rules, **options).finished.verdict
    assert [(f.kind, f.phase, f.epoch, f.outcome) for f in verdict.of_kind("leak")] == [
        ("leak", "validation", 0, "released")
    ]
    assert [p.batches for p in verdict.phases] == [176]
    clean = judged(Forecaster(), rules, **options).finished.verdict
    assert clean.status == "PASS", [f.message for f in clean.findings]


TRAINING = Rules(phase="training", max_growth="256KB")


def test_losses_accumulated_by_training_step_fail_in_training():
    finished = judged(LeakyTraining(), TRAINING, train=64, val=8).finished
    leaks = finished.verdict.of_kind("leak")
    assert [(f.kind, f.phase) for f in leaks] == [("leak", "training")]
    assert "LeakyTraining.losses" in [h.path for h in finished.holders]
    clean = judged(Forecaster(), TRAINING, train=64, val=8).finished.verdict
    assert clean.status == "PASS", [f.message for f in clean.findings]


def test_what_a_leak_holds_is_named_while_it_lives_not_only_at_the_end():
    """The callback names holders where a phase's growth crosses its budget, as the plugin
    does: the list is named though the epoch's end emptied it long before the fit ended."""
    finished = judged(KeptUntilEpochEnd(), TRAINING, epochs=1, train=64, val=8).finished
    assert [f.phase for f in finished.verdict.of_kind("leak")] == ["training"]
    (holder, *_) = finished.holders
    assert holder.path == "KeptUntilEpochEnd.losses" and holder.phase == "training"
    assert holder.growth is not None and holder.bytes >= 0.8 * holder.growth


def test_self_log_of_tensors_with_their_graph_does_not_leak():
    # Lightning detaches what self.log is given: the graphs die with the step.
    module = LogsGraphs()
    rules = Rules(phase=("training", "validation"), max_growth="256KB")
    verdict = judged(module, rules, train=32).finished.verdict
    assert module.logged_graphs == 2 * (32 + VALIDATION_BATCHES) + 2  # + the sanity check
    assert verdict.status == "PASS", [f.message for f in verdict.findings]
    assert {p.phase for p in verdict.phases} == {"training", "validation"}


# -- tagging ------------------------------------------------------------------------------------


def tagged(module: L.LightningModule | None = None, **options: object) -> list[Sample]:
    """The samples of a small fit (8 training and 6 validation batches) recorded into a
    given recorder."""
    with Recorder("cpu") as recorder:
        fit(module or Forecaster(), LeakGateCallback(recorder), train=8, val=6, **options)
        return list(recorder.samples)


def test_a_fit_records_the_trainer_checkpoints_and_the_sanity_check_is_no_epoch():
    samples = tagged()
    epoch = [
        ("EPOCH_START", "training", None),
        ("TRAIN_BATCH", "training", list(range(8))),
        ("AFTER_TRAINING", "training", None),
        ("VALIDATION_START", "validation", None),
        ("VALIDATION_BATCH", "validation", list(range(6))),
        ("VALIDATION_END", "validation", None),
        ("EPOCH_END", "epoch", None),
    ]
    assert runs(samples) == [
        ("SESSION_START", "session", None, [None]),
        ("VALIDATION_START", "sanity_check", None, [None]),
        ("VALIDATION_BATCH", "sanity_check", None, [0, 1]),
        ("VALIDATION_END", "sanity_check", None, [None]),
        *[
            (label, phase, e, batches if batches else [None])
            for e in (0, 1)
            for label, phase, batches in epoch
        ],
        ("SESSION_END", "session", None, [None]),
    ]
    assert [s.collected for s in samples if s.phase == "session"] == [True, True]
    assert not any(s.collected for s in samples if s.phase != "session")
    verdict = judge(samples, Rules(phase="validation", max_growth="1MB", warmup=0))
    assert {p.phase for p in verdict.phases} == {"validation"}


def test_limits_cut_the_loops_and_after_training_follows_the_last_batch():
    samples = tagged(limit_train_batches=5, limit_val_batches=3, num_sanity_val_steps=0)
    for e in (0, 1):
        train = [s.batch for s in samples if s.label == "TRAIN_BATCH" and s.epoch == e]
        val = [s.batch for s in samples if s.label == "VALIDATION_BATCH" and s.epoch == e]
        assert (train, val) == ([0, 1, 2, 3, 4], [0, 1, 2])
    labels = [s.label for s in samples]
    after = [i for i, label in enumerate(labels) if label == "AFTER_TRAINING"]
    assert [labels[i - 1] for i in after] == ["TRAIN_BATCH", "TRAIN_BATCH"]
    assert [labels[i + 1] for i in after] == ["VALIDATION_START", "VALIDATION_START"]
    assert "sanity_check" not in {s.phase for s in samples}


def test_two_validation_runs_per_epoch_form_one_group_numbered_on():
    samples = tagged(val_check_interval=0.5)
    epoch0 = [(s.label, s.phase, s.batch) for s in samples if s.epoch == 0]
    assert [r[:2] for r in runs([s for s in samples if s.epoch == 0])] == [
        ("EPOCH_START", "training"),
        ("TRAIN_BATCH", "training"),
        ("VALIDATION_START", "validation"),
        ("VALIDATION_BATCH", "validation"),
        ("VALIDATION_END", "validation"),
        ("TRAIN_BATCH", "training"),
        ("AFTER_TRAINING", "training"),
        ("VALIDATION_START", "validation"),
        ("VALIDATION_BATCH", "validation"),
        ("VALIDATION_END", "validation"),
        ("EPOCH_END", "epoch"),
    ]
    assert [b for label, _, b in epoch0 if label == "VALIDATION_BATCH"] == list(range(12))
    assert [b for label, _, b in epoch0 if label == "TRAIN_BATCH"] == list(range(8))
    verdict = judge(samples, Rules(phase="validation", max_growth="1MB", warmup=0))
    assert [(p.phase, p.epoch, p.batches) for p in verdict.phases] == [
        ("validation", 0, 12),
        ("validation", 1, 12),
    ]


def test_validation_every_second_epoch_keeps_the_trainer_epoch():
    samples = tagged(epochs=4, check_val_every_n_epoch=2, num_sanity_val_steps=0)
    assert sorted({s.epoch for s in samples if s.phase == "validation"}) == [1, 3]
    assert [s.epoch for s in samples if s.label == "EPOCH_END"] == [0, 1, 2, 3]
    assert [s.epoch for s in samples if s.label == "AFTER_TRAINING"] == [0, 1, 2, 3]


def test_validate_test_and_predict_are_sessions_of_their_own_phase():
    with Recorder("cpu") as recorder:
        run = trainer(LeakGateCallback(recorder))
        module = Forecaster()
        run.validate(module, loader(3, 1), verbose=False)
        run.test(module, loader(4, 2), verbose=False)
        run.predict(module, loader(5, 3))
        assert runs(recorder.samples) == [
            ("SESSION_START", "session", None, [None]),
            ("VALIDATION_START", "validation", None, [None]),
            ("VALIDATION_BATCH", "validation", None, [0, 1, 2]),
            ("VALIDATION_END", "validation", None, [None]),
            ("SESSION_END", "session", None, [None]),
            ("SESSION_START", "session", None, [None]),
            ("TESTING_START", "testing", None, [None]),
            ("TESTING_BATCH", "testing", None, [0, 1, 2, 3]),
            ("TESTING_END", "testing", None, [None]),
            ("SESSION_END", "session", None, [None]),
            ("SESSION_START", "session", None, [None]),
            ("PREDICTION_START", "prediction", None, [None]),
            ("PREDICTION_BATCH", "prediction", None, [0, 1, 2, 3, 4]),
            ("PREDICTION_END", "prediction", None, [None]),
            ("SESSION_END", "session", None, [None]),
        ]


# -- through pytest -----------------------------------------------------------------------------


def test_memtrace_and_the_marker_judge_a_fit(pytester):
    pytester.makepyfile(
        lightning_cases=Path(__file__).read_text(),
        test_fit="""
import pytest
from harness.integrations.lightning import LeakGateCallback
from lightning_cases import Forecaster, LeakyValidation, fit

@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.memleak(phase="validation", max_growth="1MB")
@pytest.mark.parametrize("module", [Forecaster, LeakyValidation])
def test_fit(memtrace, module):
    # "auto": on the device memtrace reads (a GPU when there is one)
    fit(module(), LeakGateCallback(memtrace), epochs=1, train=8, accelerator="auto")
""",
    )
    result = pytester.runpytest("-p", "no:randomly", "--memreport=out")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*leakgate: memory verdict FAIL*",
            "*[[]P0 leak[]] leak in validation epoch 0*",
            "*leakgate memory verdicts*",
            "PASS*test_fit.py::test_fit[[]Forecaster[]]",
            "FAIL*test_fit.py::test_fit[[]LeakyValidation[]]",
        ]
    )
    documents = [json.loads(p.read_text()) for p in (pytester.path / "out").glob("*.json")]
    assert sorted(d["status"] for d in documents) == ["FAIL", "PASS"]


# -- in a script --------------------------------------------------------------------------------


def test_raise_on_fail_stops_the_fit_and_the_report_is_written(tmp_path):
    rules = Rules(phase="validation", max_growth="1MB")
    callback = LeakGateCallback(rules=rules, directory=tmp_path, raise_on_fail=True)
    with pytest.raises(MemoryCheckFailed, match="leak in validation") as raised:
        fit(LeakyValidation(), callback, epochs=1)
    assert isinstance(raised.value, RuntimeError)
    assert raised.value.verdict.status == "FAIL"
    assert raised.value.finished is callback.finished
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["lightning.json", "lightning.jsonl", "lightning.md"]
    document = json.loads((tmp_path / "lightning.json").read_text())
    assert document["status"] == "FAIL"
    assert "LeakyValidation.predictions" in (tmp_path / "lightning.md").read_text()
    assert callback.recorder is not None and callback.recorder.closed

    passing = LeakGateCallback(rules=rules, directory=tmp_path / "clean", raise_on_fail=True)
    fit(Forecaster(), passing, epochs=1)
    assert json.loads((tmp_path / "clean" / "lightning.json").read_text())["status"] == "PASS"


def test_a_fit_that_raises_is_reported_as_an_error(tmp_path):
    callback = LeakGateCallback(directory=tmp_path, raise_on_fail=True)
    with pytest.raises(ValueError, match="bad batch"):
        fit(FailsInTraining(), callback, num_sanity_val_steps=0)
    assert callback.finished is not None
    assert callback.finished.verdict.status == "ERROR"
    assert "ValueError: bad batch" in (callback.finished.verdict.error or "")
    assert callback.recorder.samples[-1].note == "session ended by ValueError"
    assert json.loads((tmp_path / "lightning.json").read_text())["status"] == "ERROR"


def test_the_callback_only_records_into_a_given_recorder_unless_given_rules():
    with Recorder("cpu") as recorder:
        with pytest.raises(ValueError, match="raise_on_fail"):
            LeakGateCallback(recorder, raise_on_fail=True)
        with pytest.raises(ValueError, match="recorder the callback makes"):
            LeakGateCallback(recorder, timeline="t.jsonl")
        quiet = LeakGateCallback(recorder)
        fit(Forecaster(), quiet, epochs=1, train=2, val=2)
        assert quiet.finished is None and not recorder.closed


QUICK = Rules(phase="validation", warmup=1, max_growth="1GB")


def test_a_verdict_that_cannot_be_written_says_so_and_warns(tmp_path, capsys):
    (tmp_path / "lightning.json").mkdir()
    callback = LeakGateCallback(rules=QUICK, directory=tmp_path)
    with pytest.warns(RuntimeWarning, match="the verdict was not saved: cannot write"):
        fit(Forecaster(), callback, epochs=1, train=2, val=8)
    printed = capsys.readouterr().out
    assert "memory verdict: PASS\n" in printed
    assert f"  not saved: cannot write {tmp_path / 'lightning.json'}: Is a directory" in printed
    assert "report:" not in printed


def test_a_verdict_that_cannot_be_written_raises_with_raise_on_fail(tmp_path):
    (tmp_path / "lightning.json").mkdir()
    callback = LeakGateCallback(rules=QUICK, directory=tmp_path, raise_on_fail=True)
    with pytest.raises(UnwritableReport) as raised:
        fit(Forecaster(), callback, epochs=1, train=2, val=8)
    assert raised.value.path == str(tmp_path / "lightning.json")
    assert callback.finished is not None and callback.finished.verdict.status == "PASS"


def test_a_timeline_that_cannot_be_created_stops_the_fit_at_setup(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    callback = LeakGateCallback(rules=QUICK, directory=blocker / "reports")
    module = Forecaster()
    with pytest.raises(UnwritableReport) as raised:
        fit(module, callback, epochs=1, train=2, val=8)
    assert raised.value.path == str(blocker / "reports" / "lightning.jsonl")
    assert callback.recorder is None and callback.finished is None
    assert module.trainer.global_step == 0 and blocker.read_text() == ""


@pytest.mark.parametrize(
    ("name", "error"),
    [("..", BadInput), (".", BadInput), ("", BadInput), ("a/b", BadInput), (3, TypeError)],
)
def test_the_name_is_a_plain_file_name(name, error):
    with pytest.raises(error, match="name"):
        LeakGateCallback(name=name)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_recorder_reads_the_module_device(tmp_path):
    rules = Rules(phase=("training", "validation"), max_growth="1MB")
    callback = LeakGateCallback(rules=rules, directory=tmp_path)
    fit(Forecaster(), callback, accelerator="gpu", devices=[torch.cuda.device_count() - 1])
    recorder = callback.recorder
    assert recorder is not None
    assert recorder.probe.name == f"cuda:{torch.cuda.device_count() - 1}"
    assert recorder.header["meta"]["device"] == recorder.probe.name
    assert all(s.get("reserved") is not None for s in recorder.samples)
    assert callback.finished.verdict.status == "PASS"

import gc
import math
import weakref

import pytest
import torch
from workload import DEC, ENC, Windows, make_model

from tft.checkpoint import CheckpointError
from tft.model import TemporalFusionTransformer, TFTConfig
from tft.qat import export_int8, load_int8, qat_schedule
from tft.trainer import TrainConfig, Trainer, TrainingOOM


def fit(trainer_cls=Trainer, epochs=2, callbacks=(), **config) -> Trainer:
    trainer = trainer_cls(make_model(), TrainConfig(epochs=epochs, **config), callbacks)
    trainer.fit(Windows(12), Windows(6, seed=1))
    return trainer


def weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


class Calls:
    def __init__(self):
        self.seen = []

    def __call__(self, label, *, phase, epoch, batch, **extra):
        self.seen.append((label, phase, epoch, batch, extra))


def test_validation_batch_size_defaults_to_batch_size():
    assert TrainConfig(batch_size=4).validation_batch_size == 4
    assert TrainConfig(batch_size=4, validation_batch_size=2).validation_batch_size == 2


@pytest.mark.parametrize(
    "bad", [{"batch_size": 0}, {"epochs": -1}, {"lr": 0}, {"device": "tpu9"}, {"oom_retries": -1}]
)
def test_bad_config_is_a_value_error(bad):
    with pytest.raises(ValueError):
        TrainConfig(**bad)


def test_callbacks_see_every_named_checkpoint_in_order(tmp_path):
    calls = Calls()
    fit(epochs=1, callbacks=[calls], batch_size=4, validation_batch_size=3, checkpoint_dir=tmp_path)
    named = [c[0] for c in calls.seen if not c[0].endswith("_BATCH")]
    assert named == [
        "SESSION_START",
        "EPOCH_START",
        "AFTER_TRAINING",
        "BEFORE_VALIDATION",
        "VALIDATION_START",
        "VALIDATION_END",
        "AFTER_VALIDATION",
        "CHECKPOINT_SAVED",
        "EPOCH_END",
        "SESSION_END",
    ]
    train = [c for c in calls.seen if c[0] == "TRAIN_BATCH"]
    val = [c for c in calls.seen if c[0] == "VALIDATION_BATCH"]
    assert [c[3] for c in train] == [0, 1, 2] and {c[1] for c in train} == {"training"}
    assert [c[3] for c in val] == [0, 1] and {c[1] for c in val} == {"validation"}
    assert {c[2] for c in calls.seen if c[1] != "session"} == {0}
    assert {c[2] for c in calls.seen if c[1] == "session"} == {None}


def test_optimizer_is_released_during_validation_and_training_is_unchanged():
    seen = {}

    def spy(label, *, phase, epoch, batch, **_):
        if label in ("VALIDATION_START", "AFTER_VALIDATION"):
            seen.setdefault(label, []).append(len(spy.trainer.optimizer.state))

    class Spied(Trainer):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            spy.trainer = self

    class Kept(Trainer):
        def release_optimizer(self):
            pass

    released = fit(Spied, callbacks=[spy], batch_size=2)
    kept = fit(Kept, batch_size=2)
    assert seen["VALIDATION_START"] == [0, 0]
    assert all(n > 0 for n in seen["AFTER_VALIDATION"])
    assert_same(weights(released), weights(kept))


def test_same_seed_same_result_and_loss_is_finite():
    a, b = fit(batch_size=3), fit(batch_size=3)
    assert_same(weights(a), weights(b))
    assert a.history == b.history
    assert all(math.isfinite(h.val_loss) and len(h.q_risk) == 3 for h in a.history)


def test_no_reference_to_parameters_survives_teardown():
    trainer = fit(epochs=1, batch_size=4)
    model = trainer.model
    probe = weakref.ref(next(model.parameters()))
    del trainer, model
    gc.collect()
    assert probe() is None


def test_qat_schedule_reaches_the_optimizer():
    lrs = []

    def record(label, **_):
        if label == "TRAIN_BATCH":
            lrs.append(record.trainer.optimizer.param_groups[0]["lr"])

    class Recorded(Trainer):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            record.trainer = self

    trainer = fit(Recorded, epochs=3, callbacks=[record], batch_size=2, qat=True, lr=0.01)
    factor = qat_schedule(18, 0.1, 0.3)
    # each TRAIN_BATCH callback runs after the step's scheduler update
    assert lrs == pytest.approx([0.01 * factor(step) for step in range(1, 19)])
    assert max(lrs) == pytest.approx(0.01) and lrs[-1] < 0.1 * max(lrs)
    assert trainer.history[-1].lr == pytest.approx(lrs[-1])


def test_qat_int8_export_round_trips(tmp_path):
    trainer = fit(epochs=1, batch_size=4, qat=True)
    state = export_int8(trainer.model)
    int8 = [v for k, v in state.items() if k.endswith("weight_int8")]
    assert int8 and all(v.dtype == torch.int8 for v in int8)
    torch.save(state, tmp_path / "int8.pt")
    plain = load_int8(make_model(seed=5), torch.load(tmp_path / "int8.pt", weights_only=True))
    batch = torch.utils.data.default_collate([Windows(4)[i] for i in range(4)])
    trainer.model.eval(), plain.eval()
    with torch.no_grad():
        assert torch.allclose(plain(batch), trainer.model(batch), atol=0.05)


def test_oom_halves_the_batch_and_goes_on():
    class Tight(Trainer):
        def train_step(self, batch):
            if len(batch["target"]) > 2:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return super().train_step(batch)

    calls = Calls()
    trainer = fit(Tight, epochs=1, callbacks=[calls], batch_size=8)
    ooms = [c for c in calls.seen if c[0] == "OOM"]
    assert [(c[1], c[3]) for c in ooms] == [("training", 0), ("training", 0)]
    assert "Tried to allocate" in ooms[0][4]["note"]
    assert trainer.state.batch_size == 2 and trainer.state.retries == 2
    assert len([c for c in calls.seen if c[0] == "TRAIN_BATCH"]) == 6


def test_oom_gives_up_with_the_incident_message():
    class Hopeless(Trainer):
        def validate_step(self, batch, acc):
            raise torch.OutOfMemoryError("out of memory")

    with pytest.raises(TrainingOOM, match=r"Training OOM after 2 retries \(final batch_size=1\)"):
        fit(Hopeless, epochs=1, batch_size=4, oom_retries=3)
    with pytest.raises(TrainingOOM, match=r"after 1 retries \(final batch_size=2\) in validation"):
        fit(Hopeless, epochs=1, batch_size=4, oom_retries=1)


def test_checkpoint_resume_matches_an_uninterrupted_run(tmp_path):
    class Crash(Exception):
        pass

    def crash(label, **_):
        if label == "CHECKPOINT_SAVED":
            raise Crash

    straight = fit(epochs=2, batch_size=3, qat=True)
    with pytest.raises(Crash):
        fit(epochs=2, callbacks=[crash], batch_size=3, qat=True, checkpoint_dir=str(tmp_path))
    assert (tmp_path / "epoch-0.pt").is_file() and (tmp_path / "last.pt").is_file()
    resumed = Trainer(make_model(seed=9), TrainConfig(epochs=2, batch_size=3, qat=True))
    resumed.load_checkpoint(tmp_path / "last.pt")
    assert resumed.state.epoch == 1 and resumed.history == straight.history[:1]
    resumed.fit(Windows(12), Windows(6, seed=1))
    assert_same(weights(resumed), weights(straight))
    assert resumed.history == straight.history


class Payload:
    def __reduce__(self):
        return (print, ("unpickled!",))


def test_checkpoint_loading_refuses_arbitrary_objects(tmp_path, capsys):
    path = tmp_path / "evil.pt"
    torch.save({"model": Payload()}, path)
    trainer = Trainer(make_model(), TrainConfig())
    with pytest.raises(CheckpointError, match=r"evil\.pt: not a checkpoint"):
        trainer.load_checkpoint(path)
    assert "unpickled!" not in capsys.readouterr().out


def test_checkpoint_of_another_model_size_loads_nothing(tmp_path):
    path = tmp_path / "wide.pt"
    torch.manual_seed(1)
    wide = TFTConfig(encoder_length=ENC, decoder_length=DEC, hidden_size=16, n_heads=2)
    Trainer(TemporalFusionTransformer(wide), TrainConfig()).save_checkpoint(path)
    trainer = Trainer(make_model(), TrainConfig())
    before = weights(trainer)
    with pytest.raises(CheckpointError, match=r"wide\.pt: does not fit this model: .*shape"):
        trainer.load_checkpoint(path)
    assert_same(weights(trainer), before)
    assert trainer.optimizer.state_dict()["state"] == {}


def test_fit_flushes_subnormals_only_while_it_runs():
    seen = []

    def probe(label, **_):
        if label == "TRAIN_BATCH":
            seen.append(float(torch.tensor(1e-40) * 1))

    fit(epochs=1, callbacks=[probe], batch_size=4)
    assert set(seen) == {0.0}
    assert float(torch.tensor(1e-40) * 1) != 0.0

"""The trainer drives a real Recorder through its callbacks."""

from workload import Windows, make_model

from harness import Recorder, read_timeline
from tft.trainer import TrainConfig, Trainer

NAMED = {
    "SESSION_START",
    "EPOCH_START",
    "TRAIN_BATCH",
    "AFTER_TRAINING",
    "BEFORE_VALIDATION",
    "VALIDATION_START",
    "VALIDATION_BATCH",
    "VALIDATION_END",
    "AFTER_VALIDATION",
    "CHECKPOINT_SAVED",
    "EPOCH_END",
    "SESSION_END",
}


def test_every_named_checkpoint_reaches_the_timeline(tmp_path):
    config = TrainConfig(epochs=2, batch_size=4, checkpoint_dir=str(tmp_path / "ckpt"))
    with Recorder("cpu", timeline=tmp_path / "run.jsonl", config=config) as rec:
        Trainer(make_model(), config, callbacks=[rec]).fit(Windows(12), Windows(6, seed=1))
    assert {s.label for s in rec.samples} == NAMED
    per_epoch = [s for s in rec.samples if s.label == "VALIDATION_BATCH"]
    assert [(s.epoch, s.batch) for s in per_epoch] == [(e, b) for e in (0, 1) for b in (0, 1)]
    assert {s.phase for s in rec.samples if s.label.startswith("TRAIN")} == {"training"}
    assert all(s.get("allocated") and s.get("rss") for s in rec.samples)

    timeline = read_timeline(tmp_path / "run.jsonl")
    assert timeline.torn == 0
    assert timeline.samples == rec.samples
    assert timeline.header["config"]["batch_size"] == 4

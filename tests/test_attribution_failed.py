"""An attribution that raises at a checkpoint is seen: the recorder warns
:class:`AttributionFailed` naming what it raised, where the checkpoint was called, the run goes
on, and the checkpoint's note (in the store and in the timeline) keeps what was swallowed. This
suite's warning filters make the warning an error, so a bug in attribution fails a test."""

from __future__ import annotations

import pytest

from harness import Recorder, read_timeline
from harness._attribution.phase import PhaseAttribution
from harness._core.errors import AttributionFailed

ENTRY = "error::harness._core.errors.AttributionFailed"


@pytest.fixture
def failing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every attribution raises when it is given a reading."""

    def observe(self: PhaseAttribution, sample: object) -> bool:
        raise RuntimeError("boom")

    monkeypatch.setattr(PhaseAttribution, "observe", observe)


def test_a_failing_attribution_warns_and_the_notes_keep_it(failing, tmp_path):
    path = tmp_path / "run.jsonl"
    with (
        pytest.warns(AttributionFailed) as caught,
        Recorder("cpu", attribute=True, timeline=path) as rec,
    ):
        rec.checkpoint("setup", note="warm")
        with rec.phase("train"):
            for batch in range(3):
                rec.checkpoint("TRAIN_BATCH", batch=batch)
    first = caught[0]
    assert str(first.message) == "leakgate: attribution at 'setup' failed: RuntimeError: boom"
    assert first.filename == __file__  # said where the checkpoint was called
    assert (first.message.label, str(first.message.error)) == ("setup", "RuntimeError: boom")
    noted = {s.label: s.note for s in rec.samples}
    assert noted["setup"] == "warm; attribution failed: RuntimeError: boom"
    assert noted["train END"] == "attribution failed: RuntimeError: boom"
    assert [s.note for s in read_timeline(path).samples] == [s.note for s in rec.samples]
    assert len(rec.samples) == 6  # the run went on: every checkpoint recorded


def test_this_suite_makes_a_failing_attribution_an_error(failing, request):
    assert ENTRY in request.config.getini("filterwarnings")
    with Recorder("cpu", attribute=True) as rec, pytest.raises(AttributionFailed, match="boom"):
        rec.checkpoint("setup")

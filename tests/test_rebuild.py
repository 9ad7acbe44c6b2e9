"""A timeline carries what its verdict was judged by: rebuilt, the verdict is the same one; a
run that never finished is an error, not a pass."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from harness import Recorder, Rules, read_timeline
from harness.cli import main as leakgate
from harness.finish import finish_run
from tft.data import synth
from tft.train import main as train


def verdict_of(document: dict) -> dict:
    """The judged part of a saved run: status, error, rules, findings, phases and checks."""
    keys = ("status", "error", "rules", "findings", "phases", "checks")
    return {k: document[k] for k in keys}


def test_the_incident_rebuilt_from_its_timeline_gives_the_same_verdict(tmp_path, capsys):
    bars = synth(tmp_path / "bars.parquet", rows=2800)
    argv = ["--parquet-file", str(bars), "--epochs", "1", "--memreport", str(tmp_path / "run")]
    assert train([*argv, "--inject-fault", "val-attention-cache"]) == 1
    name = "tft-train-val-attention-cache"
    original = json.loads((tmp_path / "run" / f"{name}.json").read_text())
    assert original["status"] == "FAIL"
    assert any(f["kind"] == "leak" for f in original["findings"])
    capsys.readouterr()

    rebuilt_md = tmp_path / "rebuilt" / "r.md"
    assert leakgate(["report", str(tmp_path / "run" / f"{name}.jsonl"), "-o", str(rebuilt_md)]) == 1
    rebuilt = json.loads(rebuilt_md.with_suffix(".json").read_text())
    assert verdict_of(rebuilt) == verdict_of(original)


def test_an_out_of_memory_error_survives_the_round_trip(tmp_path):
    error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    rules = Rules(phase="validation", max_growth="1MiB")
    with Recorder("cpu", timeline=tmp_path / "oom.jsonl", rules=rules) as rec:
        rec.checkpoint("SESSION_START", phase="session", collect=True)
        with rec.phase("validation", epoch=0):
            for i in range(20):
                rec.checkpoint("VALIDATION_BATCH", batch=i)
        first = finish_run(rec, name="oom", error=error, directory=tmp_path)
    timeline = read_timeline(tmp_path / "oom.jsonl")
    assert timeline.error == "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    again = finish_run(timeline, name="again")
    assert again.verdict == first.verdict and again.verdict.status == "FAIL"
    assert [f.kind for f in again.verdict.findings] == ["oom"]


KILLED = """
import os, signal
from harness import Recorder, Rules
rec = Recorder("cpu", timeline={path!r}, rules=Rules(phase="validation", max_growth="1MB"),
               config={{"epochs": 5}})
rec.checkpoint("SESSION_START", phase="session", collect=True)
for epoch in range(2):
    with rec.phase("validation", epoch=epoch):
        for i in range(10):
            rec.checkpoint("VALIDATION_BATCH", batch=i)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_runs_timeline_is_an_error_naming_where_it_stopped(tmp_path, capsys):
    path = tmp_path / "killed.jsonl"
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(KILLED.format(path=str(path)))])
    assert done.returncode == -9
    assert leakgate(["report", str(path)]) == 1
    assert capsys.readouterr().out.startswith("ERROR: ")
    verdict = json.loads(path.with_suffix(".json").read_text())
    assert verdict["status"] == "ERROR"
    assert verdict["error"] == (
        "run ended at checkpoint 25, epoch 1 of 5: killed or crashed before its end"
    )


@pytest.mark.parametrize("after", ['{"label": "X"}', '{"leakgate_end": {"error": null}}'])
def test_nothing_may_follow_the_end_record(tmp_path, after):
    path = tmp_path / "t.jsonl"
    with Recorder("cpu", timeline=path) as rec:
        rec.checkpoint("X")
        rec.end()
    path.write_text(path.read_text() + after + "\n" + after + "\n")
    with pytest.raises(ValueError, match="after the end record"):
        read_timeline(path)

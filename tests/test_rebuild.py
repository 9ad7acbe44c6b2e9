"""A timeline carries what its verdict was judged by: rebuilt, the verdict is the same one; a
run that never finished is an error, not a pass."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from harness import Recorder, Rules, read_timeline
from harness._frontends.cli import main as leakgate
from harness._results.finish import finish_run
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
    assert str(timeline.error) == "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert timeline.error.type == "OutOfMemoryError"
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


class Cache:
    def __init__(self) -> None:
        self._items: list[torch.Tensor] = []


def leak_with_holders(folder):
    """A validation loop that keeps 256 KiB a batch in ``Cache._items``, judged and reported
    while the cache is alive, so that the report names it."""
    cache = Cache()
    rules = Rules(phase="validation", max_growth="1MiB", warmup=2)
    with Recorder("cpu", timeline=folder / "leak.jsonl", rules=rules, attribute=True) as rec:
        with rec.phase("validation", epoch=0):
            for batch in range(24):
                cache._items.append(torch.ones(2**16))
                rec.checkpoint("VALIDATION_BATCH", batch=batch)
        return finish_run(rec, name="leak", directory=folder)


def issues(report):
    return report.split("## Issues Found\n", 1)[1].split("\n## ", 1)[0]


def test_a_rebuilt_report_names_the_same_holders_and_leaves_the_original_untouched(
    tmp_path, capsys
):
    first = leak_with_holders(tmp_path)
    assert first.verdict.status == "FAIL" and first.run.holders
    assert first.run.holders[0]["path"] == "Cache._items"
    originals = {p: p.read_bytes() for p in (tmp_path / "leak.md", tmp_path / "leak.json")}
    capsys.readouterr()
    assert leakgate(["report", str(tmp_path / "leak.jsonl")]) == 1
    assert capsys.readouterr().out.endswith(
        f"wrote {tmp_path / 'leak.rebuilt.md'} and {tmp_path / 'leak.rebuilt.json'}\n"
    )
    assert {p: p.read_bytes() for p in originals} == originals
    original = json.loads(originals[tmp_path / "leak.json"])
    rebuilt = json.loads((tmp_path / "leak.rebuilt.json").read_text())
    assert verdict_of(rebuilt) == verdict_of(original)
    assert rebuilt["attribution"] == original["attribution"]
    before = issues(originals[tmp_path / "leak.md"].decode())
    assert "Cache.\\_items" in before or "Cache._items" in before
    assert issues((tmp_path / "leak.rebuilt.md").read_text()) == before


def test_a_rebuild_over_an_existing_file_says_so_and_o_names_where_it_goes(tmp_path, capsys):
    leak_with_holders(tmp_path)
    timeline = str(tmp_path / "leak.jsonl")
    assert leakgate(["report", timeline]) == 1
    capsys.readouterr()
    assert leakgate(["report", timeline]) == 1
    assert capsys.readouterr().out.endswith(
        f"wrote {tmp_path / 'leak.rebuilt.md'} (replaced) and "
        f"{tmp_path / 'leak.rebuilt.json'} (replaced)\n"
    )
    named = tmp_path / "elsewhere" / "mine.md"
    assert leakgate(["report", timeline, "-o", str(named)]) == 1
    assert named.is_file() and named.with_suffix(".json").is_file()


def test_the_gate_reads_the_runs_own_verdict_not_its_rebuilt_copy(tmp_path, capsys):
    leak_with_holders(tmp_path)
    assert leakgate(["report", str(tmp_path / "leak.jsonl")]) == 1
    capsys.readouterr()
    assert leakgate(["gate", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "gate: FAIL: 1 of 1 verdicts fail" and "leak.rebuilt" not in "".join(out)
    assert "**1 traced run:" in (tmp_path / "index.md").read_text()


@pytest.mark.parametrize(
    ("end", "field"),
    [
        ({"error": None, "holders": {"path": "x"}}, "end record.holders: expected a list"),
        ({"error": None, "shares": [1]}, "end record.shares[0]: expected an object"),
        ({"error": None, "rules": {"max_growth": "lots"}}, "end record.rules.max_growth"),
    ],
)
def test_an_end_record_that_does_not_read_is_bad_input(tmp_path, capsys, end, field):
    path = tmp_path / "t.jsonl"
    with Recorder("cpu", timeline=path) as rec:
        rec.checkpoint("X")
    lines = path.read_text().splitlines()
    path.write_text("\n".join([*lines[:-1], json.dumps({"leakgate_end": end})]) + "\n")
    assert leakgate(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"t.jsonl:3: {field}" in err

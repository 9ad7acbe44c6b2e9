"""The main job's budgets: read from ``tft/budgets.json``, set by ``benchmarks/budgets.py`` as
the largest clean reading plus k times the spread."""

import importlib.util
import json
from pathlib import Path

import pytest

import tft.train as train
from harness._core.units import parse_size
from tft.train import BUDGETS

ROOT = Path(__file__).resolve().parent.parent
SPEC = importlib.util.spec_from_file_location("budgets", ROOT / "benchmarks" / "budgets.py")
budgets = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(budgets)
KiB, MiB = 2**10, 2**20


def test_the_main_job_is_judged_by_the_budgets_file():
    written = json.loads(BUDGETS.read_text())["budgets"]
    rules = train.memory_rules()
    assert {k: rules[k] for k in written} == written
    assert set(written) == {"max_growth", "max_peak", "teardown"}


def test_a_budget_is_the_largest_reading_plus_k_spreads_rounded_up():
    peaks = [7 * MiB, 7.5 * MiB, 7.25 * MiB]
    assert budgets.budget(peaks, 3) == 9 * MiB
    assert budgets.size_text(budgets.budget(peaks, 2)) == "8.5MiB"
    assert budgets.size_text(budgets.budget(peaks, 3)) == "9MiB"
    assert budgets.size_text(17.2 * KiB) == "18KiB" and budgets.size_text(8 * MiB) == "8MiB"
    assert parse_size(budgets.size_text(12_345_678)) >= 12_345_678


def test_a_clean_runs_readings_come_from_its_verdict():
    document = {
        "phases": [
            {"phase": "training", "growth": 17_000.0, "peak_rise": 7 * MiB},
            {"phase": "validation", "growth": 2_500.0, "peak_rise": None},
        ],
        "checks": [{"rule": "teardown", "measured": 131_000}, {"rule": "oom", "measured": None}],
    }
    assert budgets.readings(document) == {
        "max_growth": 17_000.0,
        "max_peak": 7 * MiB,
        "teardown": 131_000.0,
    }


def test_each_worker_count_is_measured_and_the_widest_budget_kept(monkeypatch, tmp_path, capsys):
    readings = {
        0: [(20 * KiB, 6 * MiB, 290 * KiB), (24 * KiB, 6 * MiB, 300 * KiB)],
        2: [(36 * KiB, 7 * MiB, 280 * KiB), (37 * KiB, 7.5 * MiB, 281 * KiB)],
    }
    names = ("max_growth", "max_peak", "teardown")
    monkeypatch.setattr(
        budgets,
        "measure",
        lambda runs, device, workers: [dict(zip(names, r, strict=True)) for r in readings[workers]],
    )
    written = tmp_path / "budgets.json"
    written.write_text(json.dumps({"budgets": {}, "measured": None}))
    monkeypatch.setattr(budgets, "BUDGETS", written)
    monkeypatch.setattr(budgets, "ROOT", tmp_path)
    assert budgets.main(["--runs", "2", "--k", "3", "--num-workers", "0", "2", "--write"]) == 0
    document = json.loads(written.read_text())
    # growth: 37 + 3 KiB (2 workers) over 24 + 12 (none); peak: 7.5 + 1.5 MiB; teardown: 300 + 30
    assert document["budgets"] == {"max_growth": "40KiB", "max_peak": "9MiB", "teardown": "330KiB"}
    assert set(document["measured"]["readings"]) == {"0 workers", "2 workers"}
    assert "set by 2 workers" in capsys.readouterr().out


GOOD = {"max_growth": "64KiB", "max_peak": "8.2MiB", "teardown": "301KiB"}
TAMPERED = {  # what the file holds, and the key the one line must name (None: the file's own)
    "negative": ({"budgets": {**GOOD, "max_growth": -65536}}, "budgets.max_growth"),
    "negative text": ({"budgets": {**GOOD, "teardown": "-5KiB"}}, "budgets.teardown"),
    "huge": ({"budgets": {**GOOD, "max_peak": 10**400}}, "budgets.max_peak"),
    "huge text": ({"budgets": {**GOOD, "max_peak": "9" * 40 + "GiB"}}, "budgets.max_peak"),
    "not a size": ({"budgets": {**GOOD, "max_growth": "lots"}}, "budgets.max_growth"),
    "float": ({"budgets": {**GOOD, "max_growth": 65536.5}}, "budgets.max_growth"),
    "bool": ({"budgets": {**GOOD, "teardown": True}}, "budgets.teardown"),
    "null": ({"budgets": {**GOOD, "teardown": None}}, "budgets.teardown"),
    "list": ({"budgets": {**GOOD, "max_peak": ["8MiB"]}}, "budgets.max_peak"),
    "missing": ({"budgets": {"max_growth": "64KiB", "max_peak": "8MiB"}}, "budgets.teardown"),
    "unknown": ({"budgets": {**GOOD, "max_grwth": "1KiB"}}, "budgets.max_grwth"),
    "no budgets": ({"measured": {}}, "budgets"),
    "budgets a list": ({"budgets": [1, 2, 3]}, "budgets"),
    "a list": ([GOOD], "budgets"),
    "not JSON": ("{budgets: 64KiB", None),
    "empty": ("", None),
    "deep": ("[" * 100_000 + "]" * 100_000, None),
}


@pytest.mark.parametrize("case", TAMPERED)
def test_a_tampered_budgets_file_is_one_line_naming_it_and_the_key(
    case, tmp_path, monkeypatch, capsys
):
    content, key = TAMPERED[case]
    written = tmp_path / "budgets.json"
    written.write_text(content if isinstance(content, str) else json.dumps(content))
    monkeypatch.setattr(train, "BUDGETS", written)
    argv = ["--parquet-file", str(tmp_path / "none.parquet"), "--memreport", str(tmp_path / "out")]
    assert train.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {written}: "), lines
    assert key is None or f": {key}: " in lines[0]
    assert not (tmp_path / "out").exists()


def test_the_budgets_file_read_is_what_a_traced_run_is_judged_by(tmp_path):
    written = tmp_path / "budgets.json"
    written.write_text(json.dumps({"budgets": {**GOOD, "max_growth": 4096}}))
    rules = train.memory_rules(written)
    assert rules["max_growth"] == 4096 and rules["max_peak"] == "8.2MiB"

"""``reports/bench.md``'s children rows: checkpoints with 0, 2 and 4 workers alive, and the TFT
epoch's overhead with 2 workers held against the one without (``benchmarks/report.py``)."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPEC = importlib.util.spec_from_file_location("report", ROOT / "benchmarks" / "report.py")
report = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(report)


def bench(name: str, median_us: float, mean_us: float | None = None, **params) -> dict:
    stats = {"median": median_us / 1e6, "mean": (mean_us or median_us) / 1e6}
    return {"name": name, "params": params, "stats": stats, "extra_info": {}}


def epoch(rep: int, variant: str, seconds: float, workers: int | None, own_s: float) -> dict:
    params = {"rep": rep, "variant": variant}
    if workers is not None:  # runs from before the parameter have none: no workers
        params["workers"] = workers
    own = {"batches": 880, "checkpoints": 889, "checkpoint_median_s": 1e-4, "checkpoints_s": own_s}
    if workers:
        own["rollups"] = 60
    return {
        "name": "test_epoch",
        "params": params,
        "stats": {"median": seconds},
        "extra_info": {"cpu_s": seconds, "judge_s": 0.01, "verdict": "PASS", **own},
    }


def overheads(plain: float, recorded: dict[int | None, tuple[float, float, float]]) -> dict:
    """Two repetitions per number of workers: plain epochs of ``plain`` s, recorded ones of
    ``recorded[workers][rep]`` s whose checkpoints took ``recorded[workers][2]`` s."""
    runs = [
        epoch(rep, variant, plain if variant == "plain" else recorded[w][rep], w, recorded[w][2])
        for w in recorded
        for rep in (0, 1)
        for variant in ("plain", "recorded")
    ]
    return {n: report.epoch_overhead(b) for n, b in report.by_workers(runs).items()}


def test_checkpoints_with_workers_alive_are_a_row_each():
    benches = [
        bench("test_read_children", 4.0, workers=0, rollup=False),
        bench("test_read_children", 9000.0, workers=2, rollup=True),
        bench("test_checkpoint_children", 20.0, 26.0, workers=0, children=True),
        bench("test_checkpoint_children", 11.5, workers=0, children=False),
        bench("test_checkpoint_children", 170.0, 835.0, workers=2, children=True),
        bench("test_checkpoint_children", 264.0, 1556.0, workers=4, children=True),
    ]
    text = report.children_section(benches, {})
    assert "| 0 | 4.0 |  | 20.0 | 26.0 | 11.5 |" in text
    assert "| 2 |  | 9,000.0 | 170.0 | 835.0 |  |" in text
    assert "| 4 |  |  | 264.0 | 1,556.0 |  |" in text
    assert "TFT epoch" not in text


def test_the_workers_overhead_goal_is_judged_against_the_overhead_without():
    # The checkpoints' own time: 1% and 1.2% of a plain epoch (1.2x); the wall-time ratios
    # (+5% and +7% medians) are shown, not judged.
    met = overheads(10.0, {None: (10.4, 10.6, 0.1), 2: (10.6, 10.8, 0.12)})
    assert report.workers_vs_none(met)["ratio"] == pytest.approx(1.2)
    text = report.children_section([], met)
    assert "| 0 | 1.040 | 1.050 | 1.0% | n/a / 889 |" in text
    assert "| 2 | 1.060 | 1.070 | 1.2% | 60 / 889 |" in text
    shown = "**1.20x** (checkpoints' own time 1.2% vs 1.0%)"
    assert f"With 2 workers against none: {shown}" in text
    assert shown in goal(met) and "**met**" in goal(met)
    slower = overheads(10.0, {0: (10.4, 10.6, 0.1), 2: (10.8, 11.0, 0.12)})  # wall time alone
    assert "**met**" in goal(slower)
    dearer = overheads(10.0, {0: (10.4, 10.6, 0.1), 2: (10.4, 10.6, 0.2)})  # own time 2x
    assert report.workers_vs_none(dearer)["ratio"] == pytest.approx(2.0)
    assert "**missed**" in goal(dearer)
    assert "not measured in this run" in goal({0: met[0]})


def goal(workers: dict) -> str:
    """The workers' row of the goals table."""
    table = report.goals({}, None, None, None, None, None, workers)
    (row,) = [line for line in table.splitlines() if "DataLoader workers" in line]
    return row

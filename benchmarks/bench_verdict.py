"""Time to verdict: the commands of ``nox -s gpu_leak``, set-up excluded, against training alone.

``verdict`` runs what the session runs after its install step, with the same arguments, into a
temporary reports folder: the TFT at the incident's size, 5 epochs at batch 1, traced and
judged (``python -m tft.train ... --memreport DIR``) with the leak tests (``pytest -m memleak
--memreport=DIR tests``) beside it, then the gate (``python -m harness gate DIR --baseline
...``). ``train``
is the same training without tracing. Each command's exit code is kept: 1 is a verdict too; 2
and up, a command that could not run, is reported as such.

    pytest benchmarks/bench_verdict.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from common import ROOT

TRAIN = ["-m", "tft.train", "--epochs", "5", "--batch-size", "1"]


def commands(reports: Path) -> list[dict[str, list[str]]]:
    """The gpu_leak session's commands after set-up, writing into ``reports``: the training
    and the leak tests side by side, then the gate."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    baseline = ROOT / "reports" / "baseline" / device
    return [
        {
            "train, traced and judged": [*TRAIN, "--memreport", str(reports)],
            "leak tests": ["-m", "pytest", "-m", "memleak", f"--memreport={reports}", "tests"],
        },
        {"gate": ["-m", "harness", "gate", str(reports), "--baseline", str(baseline)]},
    ]


def run_all(stages: list[dict[str, list[str]]]) -> dict[str, dict[str, object]]:
    """Run each stage's commands side by side from the repository root, torch on one thread,
    the stages one after the other; each command's seconds, exit code and, when it could not
    give a verdict (exit 2 and up), the last line it wrote to stderr. ``"wall"`` holds the
    seconds of the whole."""
    results: dict[str, dict[str, object]] = {}
    began = time.perf_counter()
    for stage in stages:
        with ThreadPoolExecutor(len(stage)) as pool:
            done = pool.map(run_one, stage.values())
            results.update(zip(stage, done, strict=True))
    results["wall"] = {"seconds": time.perf_counter() - began, "exit": 0}
    return results


def run_one(args: list[str]) -> dict[str, object]:
    """One command of :func:`run_all`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    result: dict[str, object] = {"seconds": time.perf_counter() - started, "exit": done.returncode}
    if done.returncode not in (0, 1):
        result["error"] = (done.stderr.strip().splitlines() or ["?"])[-1]
    return result


@pytest.mark.parametrize("variant", ["train", "verdict"])
def test_time_to_verdict(benchmark, variant, tmp_path):
    steps = commands(tmp_path) if variant == "verdict" else [{"train": TRAIN}]
    benchmark.extra_info["steps"] = benchmark.pedantic(run_all, (steps,), rounds=1)

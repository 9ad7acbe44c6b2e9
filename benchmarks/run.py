"""Run every benchmark in one session and write ``reports/bench.md`` (``nox -s bench`` runs this).

    python benchmarks/run.py [--reps 3] [--sensitivity-runs 20] [--out reports/bench.md]
                             [-- PYTEST_ARGS]

pytest-benchmark runs the ``bench_*.py`` files and writes its JSON beside the report
(``bench.json``); then the sensitivity and noise-floor tables are computed in this process, and
the report is rendered from both. Exits with pytest's status.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from bench_checkpoint import noise_floor
from common import ROOT
from report import render
from sensitivity import sensitivity, shape_sensitivity

BENCHMARKS = Path(__file__).parent
FILES = (
    "bench_checkpoint.py",
    "bench_overhead.py",
    "bench_lightning.py",
    "bench_children.py",
    "bench_memray.py",
    "bench_peer.py",
    "bench_verdict.py",
    "bench_scale.py",
    "bench_history.py",
)
PACKAGES = (
    "torch",
    "numpy",
    "pytest-leakgate",
    "pytest",
    "pytest-benchmark",
    "pytest-memray",
    "memray",
    "pytorch-forecasting",
    "lightning",
)


def versions() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each A/B pair")
    parser.add_argument("--sensitivity-runs", type=int, default=20, help="runs per leak size")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "bench.md")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    raw = args.out.with_suffix(".json")
    raw.unlink(missing_ok=True)
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    env = {**os.environ, "LEAKGATE_BENCH_REPS": str(args.reps)}
    pytest = [
        sys.executable,
        "-m",
        "pytest",
        *(str(BENCHMARKS / f) for f in FILES),
        f"--benchmark-json={raw}",
        "--benchmark-sort=name",
        # pytest-memray's plugin, loaded but inactive, made a checkpoint 1.5x dearer here
        # (27.6 against 18.7 µs); its benchmark runs it in processes of its own.
        "-p",
        "no:memray",
        *args.pytest_args,
    ]
    status = subprocess.run(pytest, cwd=ROOT, env=env, check=False).returncode
    if not raw.is_file():
        print(f"pytest exited {status} and wrote no {raw}: no report", file=sys.stderr)
        return status or 1
    torch.set_num_threads(1)
    context = {
        "command": "python benchmarks/run.py " + shlex.join(argv or sys.argv[1:]),
        "reps": args.reps,
        "versions": versions(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "sensitivity": sensitivity(args.sensitivity_runs) if args.sensitivity_runs else [],
        "shapes": shape_sensitivity(args.sensitivity_runs) if args.sensitivity_runs else [],
        "noise": noise_floor(),
    }
    context["loads"] = (load_before, os.getloadavg()[0])
    context["seconds"] = time.perf_counter() - started
    args.out.write_text(render(json.loads(raw.read_text()), context))
    print(f"wrote {args.out}")
    return status


if __name__ == "__main__":
    sys.exit(main())

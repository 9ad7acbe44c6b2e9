"""Set the main job's budgets from measured spread.

Runs the clean main job (``python -m tft.train --epochs 5 --batch-size 1 --memreport DIR``) N
times for each DataLoader worker count asked for (``--num-workers 0 2``: the job runs both
ways, and its workers add to the main process's first epoch), reads each run's verdict, and
sets each budget to the largest, over the worker counts, of the largest reading plus k times
the spread (largest minus smallest) of that count's runs:

- ``max_growth``: the largest growth of any judged phase and epoch;
- ``max_peak``: the largest peak rise above a phase's start;
- ``teardown``: the residue the teardown check measured.

The budgets and what they were set from are written to ``tft/budgets.json``, which
``tft.train.memory_rules`` reads. Run it on the machine the gate runs on (a busy CI runner
spreads wider than a quiet desktop), then check that the faults the job must catch still fail:

    python benchmarks/budgets.py [--runs 5] [--k 1.5] [--device auto] [--num-workers 0 2] [--write]

Without ``--write`` it prints the budgets and changes nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness._core.units import parse_size

ROOT = Path(__file__).resolve().parent.parent
BUDGETS = ROOT / "tft" / "budgets.json"
JOB = ["-m", "tft.train", "--epochs", "5", "--batch-size", "1"]
VERDICT = "tft-train-clean.json"
KiB, MiB = 2**10, 2**20


def readings(document: Mapping[str, Any]) -> dict[str, float]:
    """One clean run's readings for each budget, in bytes, from its verdict document."""
    phases = [p for p in document.get("phases", []) if isinstance(p, Mapping)]
    teardown = [c for c in document.get("checks", []) if c.get("rule") == "teardown"]
    return {
        "max_growth": max(float(p.get("growth") or 0.0) for p in phases),
        "max_peak": max(float(p.get("peak_rise") or 0.0) for p in phases),
        "teardown": max(float(c.get("measured") or 0.0) for c in teardown),
    }


def budget(values: Sequence[float], k: float) -> float:
    """The largest reading plus ``k`` times the spread of the readings."""
    return max(values) + k * (max(values) - min(values))


def size_text(nbytes: float) -> str:
    """A budget as a size rule reads it, rounded up: whole KiB below 1 MiB, else tenths of a
    MiB."""
    if nbytes < MiB:
        return f"{max(1, math.ceil(nbytes / KiB))}KiB"
    tenths = math.ceil(10 * nbytes / MiB)
    return f"{tenths // 10}MiB" if tenths % 10 == 0 else f"{tenths / 10:.1f}MiB"


def measure(runs: int, device: str, workers: int = 0) -> list[dict[str, float]]:
    """Run the clean job ``runs`` times with ``workers`` DataLoader workers, one process each;
    each run's readings."""
    found = []
    with tempfile.TemporaryDirectory(prefix="leakgate-budgets-") as scratch:
        for i in range(runs):
            out = Path(scratch) / f"run{i}"
            started = time.monotonic()
            command = [sys.executable, *JOB, "--device", device, "--memreport", str(out)]
            command += ["--num-workers", str(workers)]
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
            path = out / VERDICT
            if not path.is_file():
                sys.exit(
                    f"run {i + 1}: no verdict (exit {done.returncode}):\n{done.stderr[-2000:]}"
                )
            document = json.loads(path.read_text())
            found.append(readings(document))
            took = time.monotonic() - started
            shown = ", ".join(f"{k} {v / KiB:.1f}KiB" for k, v in found[-1].items())
            print(
                f"{workers} workers, run {i + 1}/{runs}: {document['status']} in {took:.0f} s: "
                f"{shown}",
                flush=True,
            )
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="clean runs to measure (at least 2)")
    parser.add_argument("--k", type=float, default=1.5, help="spreads above the largest reading")
    parser.add_argument("--device", default="auto", help="what tft.train runs on")
    parser.add_argument(
        "--num-workers", type=int, nargs="+", default=[0], help="DataLoader worker counts to run"
    )
    parser.add_argument("--write", action="store_true", help=f"write {BUDGETS.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    if args.runs < 2:
        parser.error("--runs: at least 2 runs are needed for a spread")
    if min(args.num_workers) < 0:
        parser.error("--num-workers: a worker count is 0 or more")
    found = {n: measure(args.runs, args.device, n) for n in args.num_workers}
    names = list(next(iter(found.values()))[0])
    current = json.loads(BUDGETS.read_text())["budgets"]
    budgets = {}
    for name in names:
        each = {n: [r[name] for r in runs] for n, runs in found.items()}
        widest = max(each, key=lambda n: budget(each[n], args.k))
        values = each[widest]
        budgets[name] = size_text(budget(values, args.k))
        print(
            f"{name}: {budgets[name]} (was {current.get(name)}; set by {widest} workers: largest "
            f"{max(values) / KiB:.1f}KiB, spread {(max(values) - min(values)) / KiB:.1f}KiB, "
            f"k={args.k:g}; {parse_size(budgets[name]) / KiB:.0f}KiB)"
        )
    if args.write:
        measured = {
            "runs": args.runs,
            "k": args.k,
            "device": args.device,
            "readings": {
                f"{n} workers": {name: [round(r[name]) for r in runs] for name in names}
                for n, runs in found.items()
            },
            "when": time.strftime("%Y-%m-%d", time.gmtime()),
        }
        BUDGETS.write_text(json.dumps({"budgets": budgets, "measured": measured}, indent=2) + "\n")
        print(f"wrote {BUDGETS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The verdict's fit of one loop, by the loop's length: ``Fit.of`` (the Theil-Sen slope, the
Mann-Kendall tests and the broken line) as the verdict calls it, on a loop of 176, 1,000 and
10,000 batches after a 5-batch warm-up, its memory read at every batch or on the recorder's
stride (every batch of the first 32, then every 16th). The loop leaks from its middle, so the
trend is also tested near the onset (four tests, the most a fit makes). Each figure is the CPU
time of this thread (``time.thread_time``: the machine is shared), the least of several
repetitions of a few fits each, then the median over the runs; each run is a process of its own.
``--against REV`` measures the ``harness`` of a git revision the same way, its runs alternating
with this tree's.

    python benchmarks/bench_fit.py [--reps N] [--against REV] [--write]
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from common import ROOT, alternating, section_arguments, show_section

HEADING = "## The verdict's fit: its cost by loop length"
BATCHES = (176, 1_000, 10_000)
WARMUP = 5
READINGS = ("every batch", "on the stride")


def loop(batches: int, *, seed: int = 0) -> np.ndarray:
    """A loop's readings: 2 KB of noise, and a leak of 500 B a batch from its middle on."""
    rng = np.random.default_rng(seed)
    b = np.arange(batches)
    return 10**9 + np.round(rng.normal(0, 2000, batches) + 500 * np.maximum(b - batches // 2, 0))


def least(call: Callable[[], object], number: int) -> float:
    """The least thread seconds of ``number`` calls, over five repetitions, per call."""
    times = []
    for _ in range(5):
        started = time.thread_time()
        for _ in range(number):
            call()
        times.append((time.thread_time() - started) / number)
    return min(times)


def measure() -> dict[str, float]:
    """Seconds per fit, ``"<batches> <readings>"`` each, in this process."""
    from harness._measure.sample import STRIDE
    from harness._rules.fit import Fit

    found = {}
    for batches in BATCHES:
        values = loop(batches).astype(np.int64)
        x, y = np.arange(WARMUP, batches), values[WARMUP:]
        read = STRIDE.reads(x)
        for readings, keep in zip(READINGS, (np.ones(len(x), dtype=bool), read), strict=True):
            xs, ys = x[keep], y[keep]

            def fit(xs: np.ndarray = xs, ys: np.ndarray = ys, end: int = batches - 1) -> object:
                return Fit.of(xs, ys, end=end, runs=xs)

            found[f"{batches} {readings}"] = least(fit, max(3, 20_000 // batches))
    return found


def run(tree: Path) -> dict[str, float]:
    """:func:`measure` in a process importing ``harness`` from ``tree``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(ROOT / "benchmarks")])}
    command = [sys.executable, str(Path(__file__).resolve()), "--measure"]
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def revision(rev: str, into: Path) -> Path:
    """The ``harness`` folder of git revision ``rev``, unpacked under ``into``."""
    archive = into / "harness.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "archive", rev, "harness"], cwd=ROOT, stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into


def section(reps: int, against: str | None) -> str:
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        trees = {"now": ROOT} | ({"was": revision(against, Path(folder))} if against else {})
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for _, name in alternating(list(trees), reps):
            runs[name].append(run(trees[name]))
    cost = {
        name: {key: statistics.median(r[key] for r in found) for key in found[0]}
        for name, found in runs.items()
    }
    now = cost["now"]
    rows = []
    for batches in BATCHES:
        cells = []
        for readings in READINGS:
            key = f"{batches} {readings}"
            ms, ratio = now[key] * 1e3, now[key] / now[f"{BATCHES[0]} {readings}"]
            cell = f"{ms:.2f} ms, {ms * 1e3 / batches:.2f} µs a batch, {ratio:.1f}x"
            cells.append(cell + (f" (was {cost['was'][key] * 1e3:.2f} ms)" if against else ""))
        rows.append(f"| {batches:,} ({batches / BATCHES[0]:.1f}x) | {' | '.join(cells)} |")
    first, last = now[f"{BATCHES[0]} {READINGS[0]}"], now[f"{BATCHES[-1]} {READINGS[0]}"]
    linear = all(
        now[f"{b} {r}"] / b <= now[f"{a} {r}"] / a
        for r in READINGS
        for a, b in itertools.pairwise(BATCHES)
    )
    command = f"python benchmarks/bench_fit.py --reps {reps}" + (
        f" --against {against}" if against else ""
    )
    was = f", alternating with revision `{against}`'s (was)" if against else ""
    met = "met" if linear else "missed"
    return f"""{HEADING}

Measured by `{command}` (load average {load:.2f} at the start; the median of {reps} runs{was}).
`Fit.of` as the verdict calls it, on a loop of that many batches after a 5-batch warm-up, leaking
from its middle (so its trend is tested four times), its memory read at every batch or on the
recorder's stride; CPU time of the thread per fit, and the multiple of the 176-batch loop's.

| batches | read at every batch | read on the stride |
|---|---:|---:|
{chr(10).join(rows)}

The fit of a 176-batch loop read at every batch: **{first * 1e3:.2f} ms** (goal: well under 1 ms).
10,000 batches cost {last / first:.1f}x what 176 do, for {BATCHES[-1] / BATCHES[0]:.0f}x the
batches; the cost a batch {"falls" if linear else "does not fall"} from each length to the next
(goal: at most linear, **{met}**). What grows: the Theil-Sen slopes' pairs, O(n²) in the spans up
to 1,024 (bounded after); the Mann-Kendall counts, about n^1.5 steps from blocks' histograms of
ranks; the knots, a fixed grid of 52 x 52 pairs weighed from running sums."""


def main() -> None:
    if "--measure" in sys.argv:
        print(json.dumps(measure()))
        return
    parser = section_arguments(__doc__.splitlines()[0])
    parser.add_argument("--against", help="another checkout to measure the same way")
    args = parser.parse_args()
    show_section(HEADING, section(args.reps, args.against), args.write)


if __name__ == "__main__":
    main()

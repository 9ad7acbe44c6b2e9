"""What leakgate's holder searches cost, written as their own section of ``reports/bench.md``.

At scale: a fresh process holds N live Python objects (frozen, as a recorder freezes what
exists when it starts), then a leak of 24 tensors of 64 KiB in a list; the plain search
(``attribute``: the new tensors' holders, which stops once it has reached them all) and the
search by retained size (``retained_holders``: every new object weighed, the dominator tree,
the accumulation point) each run once, timed, with the process's peak resident memory before
and after (``VmHWM``).

The leaky loop: ``tool_loops/test_loops.py``'s ``kept`` and ``held`` tests (see
``bench_memray.py``) under no plugin, leakgate and pytest-memray, one process each per
repetition; a test's time is its whole protocol.

Beside a user's tools: ``observer_loops/test_observed.py`` (300 batches, ``max_growth="4MB"``)
runs in one pytest process per variant and repetition, variants alternating: under a torch
profiler left running (``with_stack=True``) and under a ``sys.settrace`` tracer, each without
leakgate and with its ``memleak`` marker. A variant's time is the whole process's wall time; its
memory the process's peak resident size (``wait4``'s ``ru_maxrss``).

    python benchmarks/bench_search.py [--reps N] [--write]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import section_arguments, show_section

HERE = Path(__file__).parent
ROOT = HERE.parent
LOOPS = HERE / "observer_loops"
HEADING = "## Holder searches"


def observed(tool: str, plugin: bool) -> dict[str, object]:
    """One pytest process over the observed loop: its wall time, peak RSS and verdict."""
    env = {**os.environ, "OBSERVED_TOOL": tool, "OBSERVED_PLUGIN": "1" if plugin else "0"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "test_observed.py"]
    if not plugin:
        command[4:4] = ["-p", "no:leakgate"]
    started = time.perf_counter()
    process = subprocess.Popen(
        command, cwd=LOOPS, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert process.stdout is not None
    out = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - started
    verdict = re.search(r"^(PASS|FAIL|ERROR)\s+(\S+)", out, re.M)
    broken = [w for w in ("MemoryError", "INTERNALERROR", "bad_alloc") if w in out]
    return {
        "seconds": seconds,
        "peak": usage.ru_maxrss * 1024,
        "verdict": " ".join(verdict.groups()) if verdict else "-",
        "broken": ", ".join(broken) or "none",
        "exit": process.returncode,
    }


def one_scale(objects: int) -> dict[str, float]:
    """In this process: ``objects`` live objects, a leak, each search once."""
    import gc

    import torch

    from harness._attribution.holders import attribute
    from harness._attribution.retained import retained_holders
    from harness._attribution.snapshot import live_tensors

    torch.set_num_threads(1)
    heap = [{"i": [i]} for i in range(objects // 3)]  # a dict and a list each: 2 tracked objects
    gc.collect()
    gc.freeze()
    before = live_tensors(objects=True)
    kept = [torch.ones(16384) for _ in range(24)]  # noqa: F841  (the leak)
    found: dict[str, float] = {"objects": float(len(heap) * 3)}
    for name, search in (
        ("plain", lambda: attribute(before)),
        ("retained", lambda: retained_holders(before, 2_000_000)),
    ):
        peak = _peak()
        started = time.perf_counter()
        holders = search()
        found[f"{name}_s"] = time.perf_counter() - started
        found[f"{name}_mib"] = max(_peak() - peak, 0) / 2**20
        found[f"{name}_named"] = float(bool(holders) and holders[0].path.endswith("kept"))
    return found


def _peak() -> int:
    """The process's resident high-water mark, in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def scale() -> str:
    """The table of search costs at 100k, 500k and 1M live objects, one process each."""
    import json

    rows = []
    for objects in (100_000, 500_000, 1_000_000):
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(
            [sys.executable, __file__, "--one", str(objects)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        r = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(
            f"| {objects:,} | {r['plain_s'] * 1000:.0f} ms, +{r['plain_mib']:.0f} MiB | "
            f"{r['retained_s'] * 1000:.0f} ms, +{r['retained_mib']:.0f} MiB | "
            f"{'yes' if r['plain_named'] and r['retained_named'] else 'no'} |"
        )
    return "\n".join(
        [
            "| live objects | plain search | by retained size | both name the leak |",
            "|---:|---:|---:|---|",
            *rows,
        ]
    )


def loops(reps: int) -> str:
    """The leaky loops under each tool: median time of each test, and whether it failed."""
    import importlib.util
    import json
    import tempfile

    tools = {
        "plain": ["-p", "no:leakgate", "-p", "no:memray"],
        "leakgate": ["-p", "no:memray"],
        "memray": ["-p", "no:leakgate", "--memray"],
    }
    if importlib.util.find_spec("pytest_memray") is None:
        del tools["memray"]
    seen: dict[str, dict[str, list[float]]] = {t: {} for t in ("plain", "leakgate", "memray")}
    failed: dict[str, dict[str, int]] = {t: {} for t in seen}
    for _ in range(reps):
        for tool, flags in tools.items():
            with tempfile.TemporaryDirectory() as folder:
                results = Path(folder) / "results.json"
                env = {**os.environ, "LOOP_TOOL": tool, "LOOP_RESULTS": str(results)}
                paths = (str(ROOT), env.get("PYTHONPATH"))
                env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
                done = subprocess.run(
                    [sys.executable, "-m", "pytest", "-q", *flags, "test_loops.py"],
                    cwd=HERE / "tool_loops",
                    env=env,
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if not results.is_file():
                    sys.exit(f"the {tool} loop wrote no results:\n{done.stdout[-2000:]}")
                for kind, result in json.loads(results.read_text()).items():
                    seen[tool].setdefault(kind, []).append(result["seconds"] * 1000)
                    failed[tool][kind] = failed[tool].get(kind, 0) + bool(result["failed"])
    rows = []
    for kind in ("kept", "held"):
        cells = [
            f"{statistics.median(seen[t][kind]):.0f} ms ({failed[t][kind]}/{reps} failed)"
            if kind in seen[t]
            else "not installed"
            for t in ("plain", "leakgate", "memray")
        ]
        plain = statistics.median(seen["plain"][kind])
        costs = [
            f"+{statistics.median(seen[t][kind]) - plain:.0f} ms" if kind in seen[t] else "-"
            for t in ("leakgate", "memray")
        ]
        rows.append(f"| {kind} | {' | '.join(cells)} | {' | '.join(costs)} |")
    return "\n".join(
        [
            "| loop | plain | leakgate | pytest-memray | leakgate cost | memray cost |",
            "|---|---:|---:|---:|---:|---:|",
            *rows,
        ]
    )


def observers(reps: int) -> str:
    """The section's table beside a profiler and a tracer."""
    rows = []
    for tool in ("profiler", "tracer"):
        runs: dict[bool, list[dict[str, object]]] = {False: [], True: []}
        for _ in range(reps):
            for plugin in (False, True):
                runs[plugin].append(observed(tool, plugin))
        plain, traced = runs[False], runs[True]
        ratio = statistics.median(
            float(b["seconds"]) / float(a["seconds"])  # type: ignore[arg-type]
            for a, b in zip(plain, traced, strict=True)
        )
        memory = statistics.median(
            int(b["peak"]) / int(a["peak"])  # type: ignore[call-overload]
            for a, b in zip(plain, traced, strict=True)
        )
        rows.append(
            f"| {tool} | {_median(plain, 'seconds'):.1f} s, {_median(plain, 'peak') / 2**20:.0f}"
            f" MiB | {_median(traced, 'seconds'):.1f} s, {_median(traced, 'peak') / 2**20:.0f} MiB"
            f" | {ratio:.2f}x | {memory:.2f}x | {traced[-1]['verdict']} | {traced[-1]['broken']} |"
        )
    return "\n".join(
        [
            "| tool | without leakgate | with leakgate | time ratio | peak ratio | verdict | "
            "errors |",
            "|---|---:|---:|---:|---:|---|---|",
            *rows,
        ]
    )


def _median(runs: list[dict[str, object]], key: str) -> float:
    return statistics.median(float(r[key]) for r in runs)  # type: ignore[arg-type]


def section(reps: int) -> str:
    load = os.getloadavg()[0]
    table = observers(reps)
    print(table, flush=True)
    sizes = scale()
    print(sizes, flush=True)
    leaky = loops(reps)
    return "\n\n".join(
        [
            HEADING,
            f"Measured by `python benchmarks/bench_search.py --reps {reps} --write` "
            f"(load average {load:.2f} at the start; median over {reps} repetitions, "
            "variants alternating).",
            "### Beside a profiler and a tracer",
            "`benchmarks/observer_loops/test_observed.py`, 300 batches under "
            '`memleak(phase="validation", max_growth="4MB", warmup=5)`. A search runs in a '
            "thread of its own, which neither tool watches: the profiler records none of it and "
            "its growth stays the loop's own. Time and peak resident memory are the whole pytest "
            "process's.",
            table,
            "### The search at scale",
            "One process per size: N live objects frozen, then a leak of 24 tensors in a list; "
            "each search once, its time and the rise of the process's peak resident memory "
            "(`VmHWM`). The plain search stops once it has reached every new tensor; the search "
            "by retained size walks every object, as it runs only where the largest of the "
            "tensors' holders holds under three quarters of a growth of 512 KiB or more.",
            sizes,
            "### The leaky loops against pytest-memray",
            "`tool_loops/test_loops.py` (see section 3), the loops that leak; each test's whole "
            "protocol, median.",
            leaky,
        ]
    )


def main() -> None:
    parser = section_arguments(__doc__.splitlines()[0])
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        import json

        print(json.dumps(one_scale(args.one)))
        return
    show_section(HEADING, section(args.reps), args.write)


if __name__ == "__main__":
    main()

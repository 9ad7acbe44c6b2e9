"""What leakgate's holder searches cost, written as their own section of ``reports/bench.md``.

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

HERE = Path(__file__).parent
ROOT = HERE.parent
BENCH = ROOT / "reports" / "bench.md"
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
        ]
    )


def write(text: str) -> None:
    """Put ``text`` in place of this file's section of ``reports/bench.md`` (or after it)."""
    old = BENCH.read_text()
    start = old.find(HEADING)
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    else:
        end = old.find("\n## ", start + len(HEADING))
        new = old[:start] + text + "\n" + (old[end:] if end >= 0 else "")
    temporary = BENCH.with_name(f".{BENCH.name}.tmp")
    temporary.write_text(new)
    os.replace(temporary, BENCH)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="update reports/bench.md")
    args = parser.parse_args()
    text = section(args.reps)
    print(text)
    if args.write:
        write(text)


if __name__ == "__main__":
    main()

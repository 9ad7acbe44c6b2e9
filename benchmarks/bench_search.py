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
leakgate, with its ``memleak`` marker, and with the marker under ``--memreport-explain``. A
variant's time is the whole process's wall time; its memory the process's peak resident size
(``wait4``'s ``ru_maxrss``); each ratio is taken against the same repetition's run without
leakgate. ``--observers`` runs that part alone (and writes its own subsection).

    python benchmarks/bench_search.py [--reps N] [--observers] [--write]
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

from common import alternating, section_arguments, show_section

HERE = Path(__file__).parent
ROOT = HERE.parent
LOOPS = HERE / "observer_loops"
HEADING = "## Holder searches"
OBSERVERS = "### Beside a profiler and a tracer"
VARIANTS = {"plain": ["-p", "no:leakgate"], "leakgate": [], "explain": ["--memreport-explain"]}
"""pytest's options for each variant of the observed loop."""


def observed(tool: str, variant: str) -> dict[str, object]:
    """One pytest process over the observed loop in ``variant`` (a key of :data:`VARIANTS`):
    its wall time, peak RSS and verdict."""
    plugin = variant != "plain"
    env = {**os.environ, "OBSERVED_TOOL": tool, "OBSERVED_PLUGIN": "1" if plugin else "0"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", *VARIANTS[variant]]
    command.append("test_observed.py")
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


def observers(reps: int, alone: bool = False) -> str:
    """The subsection beside a profiler and a tracer: its conditions and its table (``alone``:
    measured by ``--observers``)."""
    load = os.getloadavg()[0]
    rows = []
    for tool in ("profiler", "tracer"):
        runs: dict[str, list[dict[str, object]]] = {v: [] for v in VARIANTS}
        for _, variant in alternating(list(VARIANTS), reps):
            runs[variant].append(observed(tool, variant))
        plain = runs["plain"]
        for variant in ("leakgate", "explain"):
            rows.append(_observed_row(tool, variant, plain, runs[variant]))
    return "\n\n".join(
        [
            OBSERVERS,
            f"Measured by `python benchmarks/bench_search.py {'--observers ' * alone}--reps {reps}"
            " --write` "
            f"(load average {load:.2f} at the start, on a 2-core machine shared with other work: "
            f"times are noisier than its memory; median over {reps} repetitions, the three "
            "variants alternating, each ratio against the same repetition's run without "
            "leakgate).",
            "`benchmarks/observer_loops/test_observed.py`, 300 batches under "
            '`memleak(phase="validation", max_growth="4MB", warmup=5)`; `explain` adds '
            "`--memreport-explain`. A search runs in a thread of its own, which neither tool "
            "watches: the profiler records none of it and its growth stays the loop's own. "
            "Explain's dispatch mode notes each operator's storages in the loop's own thread, "
            "where the profiler records the functions it calls and the tracer keeps the lines it "
            "runs: what they keep of it is theirs, and grows the verdict's figure. Time and peak "
            "resident memory are the whole pytest process's.",
            "| tool | leakgate | without leakgate | with leakgate | time ratio | peak ratio | "
            "verdict | errors |\n|---|---|---:|---:|---:|---:|---|---|\n" + "\n".join(rows),
        ]
    )


def _observed_row(
    tool: str, variant: str, plain: list[dict[str, object]], traced: list[dict[str, object]]
) -> str:
    """One row of the observers' table: medians, and the median of each repetition's ratios."""
    ratio = statistics.median(
        float(b["seconds"]) / float(a["seconds"])  # type: ignore[arg-type]
        for a, b in zip(plain, traced, strict=True)
    )
    memory = statistics.median(
        int(b["peak"]) / int(a["peak"])  # type: ignore[call-overload]
        for a, b in zip(plain, traced, strict=True)
    )
    return (
        f"| {tool} | {variant} | {_median(plain, 'seconds'):.1f} s, "
        f"{_median(plain, 'peak') / 2**20:.0f} MiB | {_median(traced, 'seconds'):.1f} s, "
        f"{_median(traced, 'peak') / 2**20:.0f} MiB | {ratio:.2f}x | {memory:.2f}x | "
        f"{traced[-1]['verdict']} | {traced[-1]['broken']} |"
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
    parser.add_argument(
        "--observers", action="store_true", help="only beside a profiler and a tracer"
    )
    args = parser.parse_args()
    if args.one:
        import json

        print(json.dumps(one_scale(args.one)))
        return
    if args.observers:
        text = observers(args.reps, alone=True)
        print(text)
        if args.write:
            write_subsection(OBSERVERS, text)
        return
    show_section(HEADING, section(args.reps), args.write)


def write_subsection(heading: str, text: str) -> None:
    """Put ``text`` in place of the subsection under ``heading`` in ``reports/bench.md`` (up to
    the next heading of its level or above), written whole, then renamed."""
    bench = ROOT / "reports" / "bench.md"
    old = bench.read_text()
    start = old.index(heading)
    ends = [old.find(mark, start + len(heading)) for mark in ("\n### ", "\n## ")]
    end = min((e for e in ends if e >= 0), default=len(old))
    temporary = bench.with_name(f".{bench.name}.tmp")
    temporary.write_text(old[:start] + text + "\n" + old[end:])
    os.replace(temporary, bench)


if __name__ == "__main__":
    main()

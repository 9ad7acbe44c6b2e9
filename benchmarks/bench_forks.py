"""What a test whose children exit at once costs, plain, under ``--memreport`` and under
``--memreport-explain``: 300 children forked by ``os.fork`` in 30 batches of 10, each exiting at
once, the test's own process a torch process. Each variant is one pytest process; the figure is
the loop's wall time per child (fork, the child's at-fork hooks and exit, ``waitpid``), and the
process's anonymous resident memory (``RssAnon``) when the loop ends, which each fork copies the
page tables of. The test makes an optimizer first, as a trainer does: torch then imports its
compiler (70 MiB), plain or not. Repetitions alternate the variants; the ratio is per
repetition, then the median.

    python benchmarks/bench_forks.py [--reps N] [--write]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import alternating, section_arguments, show_section

ROOT = Path(__file__).resolve().parent.parent
HEADING = "## Children that exit at once"
FORKS, PER_BATCH = 300, 10
VARIANTS = {
    "plain": [],
    "--memreport": ["--memreport={out}"],
    "--memreport-explain": ["--memreport={out}", "--memreport-explain"],
}
TEST = f"""
import json, os, time

import pytest
import torch


@pytest.mark.memleak(phase="work", max_growth="4MB", warmup=2)
def test_children_exit_at_once(memtrace):
    kept = [torch.randn(64, 64) for _ in range(50)]
    torch.optim.SGD(torch.nn.Linear(4, 1).parameters(), lr=0.1)  # a trainer's: torch's compiler
    started = time.perf_counter()
    with memtrace.phase("work"):
        for batch in range({FORKS // PER_BATCH}):
            children = []
            for _ in range({PER_BATCH}):
                pid = os.fork()
                if pid == 0:
                    os._exit(0)
                children.append(pid)
            for pid in children:
                os.waitpid(pid, 0)
            memtrace.checkpoint("BATCH", batch=batch)
    seconds = time.perf_counter() - started
    with open("/proc/self/status") as status:
        anon = next(int(line.split()[1]) for line in status if line.startswith("RssAnon:"))
    with open(os.environ["FORKS_OUT"], "w") as out:
        json.dump({{"seconds": seconds, "anon": anon * 1024}}, out)
    del kept
"""


def one(variant: str, folder: Path) -> dict[str, float]:
    """One pytest process of ``variant`` over the test: its loop's seconds and RssAnon."""
    result = folder / "result.json"
    result.unlink(missing_ok=True)
    extra = [a.format(out=folder / "reports") for a in VARIANTS[variant]]
    env = {**os.environ, "FORKS_OUT": str(result)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider"]
    subprocess.run(
        [*command, *extra, "test_forks.py"], cwd=folder, env=env, check=True, capture_output=True
    )
    return json.loads(result.read_text())


def section(reps: int) -> str:
    load = os.getloadavg()[0]
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="bench-forks-") as temporary:
        folder = Path(temporary)
        (folder / "test_forks.py").write_text(TEST)
        for _, variant in alternating(list(VARIANTS), reps):
            runs[variant].append(one(variant, folder))
    rows = ["| variant | ms per child | x plain | RssAnon MiB |", "|---|---:|---:|---:|"]
    for variant, found in runs.items():
        ms = statistics.median(r["seconds"] for r in found) / FORKS * 1e3
        ratio = statistics.median(
            r["seconds"] / p["seconds"] for r, p in zip(found, runs["plain"], strict=True)
        )
        anon = statistics.median(r["anon"] for r in found) / 2**20
        rows.append(f"| {variant} | {ms:.2f} | {ratio:.2f} | {anon:.0f} |")
    return "\n\n".join(
        [
            HEADING,
            f"Measured by `python benchmarks/bench_forks.py --reps {reps} --write` (load average "
            f"{load:.2f} at the start; median over {reps} repetitions, variants alternating).",
            f"{FORKS} children forked in batches of {PER_BATCH} by a recorded test that made an "
            "optimizer first, as a trainer does, each child exiting at once (the shape of a test "
            "whose children exit while they are read). A fork's cost follows the process's "
            "anonymous memory, whose page tables it copies: torch's compiler, which torch "
            "imports at the first optimizer (and explain when it opens), is 70 MiB of it. In "
            "the child, leakgate's at-fork hooks open the child's slot on the heap board and, "
            "under explain, stop `tracemalloc`, which frees every trace the parent held (each a "
            "page the child copies); memray's tracker ends its tracking in the child.",
            "\n".join(rows),
        ]
    )


def main() -> None:
    args = section_arguments(__doc__.splitlines()[0]).parse_args()
    show_section(HEADING, section(args.reps), args.write)


if __name__ == "__main__":
    main()

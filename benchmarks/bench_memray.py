"""Against pytest-memray: the same loops as pytest tests under each tool, and what each caught.

``tool_loops/test_loops.py`` runs in a pytest subprocess per tool (``plain``: neither plugin;
``leakgate``; ``memray``: ``--memray`` with ``limit_leaks``), its own configuration, one process
per repetition, tools alternating. Each test's protocol (set-up, call, tear-down, every plugin
hook in them) is timed inside the subprocess; a tool's cost is its time minus ``plain``'s. The
benchmark itself times the whole subprocess.

    pytest benchmarks/bench_memray.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from common import REPS, alternating

LOOPS = Path(__file__).parent / "tool_loops"
TOOLS = {
    "plain": ["-p", "no:leakgate", "-p", "no:memray"],
    "leakgate": ["-p", "no:memray"],
    "memray": ["-p", "no:leakgate", "--memray"],
}


@pytest.mark.parametrize(("rep", "tool"), alternating(tuple(TOOLS), 2 * REPS))
def test_loops(benchmark, tool, rep, tmp_path):
    if tool == "memray":
        pytest.importorskip("pytest_memray")
    results = tmp_path / "results.json"
    command = [sys.executable, "-m", "pytest", "-q", *TOOLS[tool], "test_loops.py"]
    env = {**os.environ, "LOOP_TOOL": tool, "LOOP_RESULTS": str(results)}
    done = benchmark.pedantic(
        subprocess.run,
        (command,),
        {"cwd": LOOPS, "env": env, "capture_output": True, "text": True},
        rounds=1,
    )
    assert results.is_file(), done.stdout[-2000:] + done.stderr[-2000:]
    benchmark.extra_info["tests"] = json.loads(results.read_text())

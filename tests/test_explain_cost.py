"""What ``--memreport-explain`` costs at each operator, as a user's profiler sees it, and what it
imports once tracing runs: explain notes every storage an operator makes from inside the user's
thread, where a profiler with ``with_stack=True`` records each function it calls (in memory the
test is judged on) and a tracer each line it runs. The walk to the caller's line calls nothing
per frame, an operator's single tensor is noted without walking a tree, and memray (the native
lines' module) is imported before tracing starts, not traced."""

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from harness._attribution.lines import Lines

ROOT = Path(__file__).resolve().parent.parent

NESTED = """
def doubled(depth, x):
    return x * 2 if depth == 0 else doubled(depth - 1, x)
"""
NESTED_IN_TORCH = os.path.join(os.path.dirname(torch.__file__), "leakgate_nested_frames.py")
"""A file name among torch's: its frames are passed over on the way to the caller's line."""


def doubled() -> Callable[[int, torch.Tensor], torch.Tensor]:
    """A function that doubles a tensor under ``depth`` frames of torch's own."""
    space: dict[str, object] = {}
    exec(compile(NESTED, NESTED_IN_TORCH, "exec"), space)
    return space["doubled"]  # type: ignore[return-value]


def profiled(run: Callable[[], object]) -> list[tuple[str, str]]:
    """The calls a profile function sees while ``run`` runs: ``(event, function name)``."""
    seen: list[tuple[str, str]] = []

    def profile(frame, event, arg):  # type: ignore[no-untyped-def]
        if event in ("call", "c_call"):
            name = frame.f_code.co_filename if event == "call" else getattr(arg, "__name__", "")
            seen.append((event, name))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return seen


def test_the_walk_to_the_callers_line_calls_nothing_for_each_frame_it_passes():
    lines, double, x = Lines(), doubled(), torch.ones(8)
    kept = []
    lines.open()
    try:
        counts = {}
        for depth in (2, 40):
            kept.append(double(depth, x))  # each file is first seen here
            counts[depth] = len(profiled(lambda d=depth: kept.append(double(d, x))))
        named = lines.line(("cpu", None, kept[-1].untyped_storage().data_ptr()))
    finally:
        lines.close()
    assert named is not None and named.startswith("tests/test_explain_cost.py:")
    # the 38 frames more of torch's are the doubling function's own calls, none of explain's
    assert counts[40] - counts[2] == 38


def test_an_operators_single_tensor_is_noted_without_walking_a_tree():
    lines = Lines()
    x = torch.ones(8)
    lines.open()
    try:
        seen = profiled(lambda: x * 2)
    finally:
        lines.close()
    assert not [name for event, name in seen if event == "call" and name.endswith("_pytree.py")]


IMPORTS = """
import tracemalloc
import sys
from harness._attribution.lines import Lines
from harness._attribution.native import Native

assert "memray" not in sys.modules
lines = Lines()
lines.open()  # as a recorder opens, before the test's call
lines.trace()  # at the first phase
with Native():  # the test's call, explained
    import memray
init = memray.__file__
traces = tracemalloc.take_snapshot().traces
print(sum(t.size for t in traces if any(f.filename == init for f in t.traceback)))
"""


def test_memrays_import_is_not_traced():
    pytest.importorskip("memray")
    done = subprocess.run(
        [sys.executable, "-c", IMPORTS],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == 0  # traced, memray's own modules held 440 KiB of traces

"""What ``--memreport-explain`` adds to the process it explains: no compiler imported for its
operator mode (800 modules and 70 MiB, which every fork of the process then copied the page
tables of), unless the process imported it already, where the mode stays hidden from it; and no
fork hook registered before explain first opens."""

import subprocess
import sys

TEST = """
import sys

import pytest
import torch


@pytest.mark.memleak(phase="validation", max_growth="4MB", warmup=2)
def test_explained_loop(memtrace):
    with memtrace.phase("validation", epoch=0):
        for i in range(8):
            torch.randn(16, 16) @ torch.randn(16, 16)
            memtrace.checkpoint("VALIDATION_BATCH", batch=i)
    with open("modules.txt", "w") as out:
        out.write("torch._dynamo" in sys.modules and "dynamo" or "none")
"""


def test_an_explained_test_imports_no_compiler(pytester):
    pytester.makepyfile(test_loop=TEST)
    options = ("-p", "no:randomly", "--memreport=o", "--memreport-explain")
    result = pytester.runpytest_subprocess(*options)
    result.assert_outcomes(passed=1)
    assert "PASS" in result.stdout.str()
    assert (pytester.path / "modules.txt").read_text() == "none"


def test_where_the_compiler_is_imported_the_mode_is_hidden_from_it():
    script = """
import torch._dynamo
from harness.attribution.lines import Lines
lines = Lines()
lines.open()
print(type(lines._mode)._should_skip_dynamo())
lines.close()
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True"]


def test_importing_the_explain_bookkeeping_registers_no_fork_hook():
    script = """
import os
calls = []
register = os.register_at_fork
os.register_at_fork = lambda **hooks: calls.extend(hooks.values()) or register(**hooks)
import harness.attribution.lines as lines
ours = lambda: [f for f in calls if (getattr(f, "__module__", None) or "").startswith("harness")]
print(len(ours()))
lines.Lines().open()
print(len(ours()))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "1"]

"""What a type checker sees of the public API: sizes and phases typed as ``Rules`` stores them,
a registered rule as its own function, an unknown ``harness`` name as an error, and the verdict,
header and holders as their types (mypy run once on a small snippet)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("mypy")

ROOT = Path(__file__).resolve().parent.parent
"""The checkout whose ``harness`` the snippet is checked against (an editable install's import
hook is invisible to mypy)."""

SNIPPET = textwrap.dedent(
    """
    import harness
    from harness import MemoryCheckFailed, Recorder, Rules, register_rule
    from harness._report.run import Run

    harness.NoSuchName
    reveal_type(Rules(max_growth="4MB").max_growth)
    reveal_type(Rules(phase=["train", "validation"]).phase)

    @register_rule("typed_rule")
    def typed_rule(ctx: object, option: int) -> list[harness.Finding]:
        return []

    reveal_type(typed_rule)

    def read(error: MemoryCheckFailed, rec: Recorder, run: Run) -> None:
        reveal_type(error.verdict)
        reveal_type(rec.header)
        reveal_type(run.holders)
    """
)


CONFIG = """
[mypy]
ignore_missing_imports = True
[mypy-torch.*,numpy.*,pyarrow.*,lightning.*,memray.*,pynvml.*]
follow_imports = skip
"""
"""The large libraries are not followed (their names read as ``Any``): the snippet checks
leakgate's own types, in seconds."""


@pytest.fixture(scope="module")
def mypy_lines(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    folder = tmp_path_factory.mktemp("typing")
    (folder / "snippet.py").write_text(SNIPPET)
    (folder / "mypy.ini").write_text(CONFIG)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--no-incremental",
            "--config-file",
            "mypy.ini",
            "--cache-dir",
            str(folder / "cache"),
            "snippet.py",
        ],
        cwd=folder,
        env={**os.environ, "MYPYPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.splitlines()


def _at(lines: list[str], line: int) -> str:
    return "\n".join(x for x in lines if x.startswith(f"snippet.py:{line}:"))


def test_an_unknown_harness_name_is_a_type_error(mypy_lines):
    assert 'has no attribute "NoSuchName"' in _at(mypy_lines, 6)


def test_rules_sizes_and_phases_are_typed_as_stored(mypy_lines):
    assert 'Revealed type is "int | None"' in _at(mypy_lines, 7)
    assert 'Revealed type is "tuple[str, ...] | None"' in _at(mypy_lines, 8)


def test_a_registered_rule_keeps_its_type(mypy_lines):
    revealed = _at(mypy_lines, 14)
    assert 'Revealed type is "def (ctx: object, option: int) -> list[' in revealed


def test_verdict_header_and_holders_are_typed(mypy_lines):
    assert 'Revealed type is "harness._verdict.model.Verdict"' in _at(mypy_lines, 17)
    assert "TypedDict(harness._core.records.Header" in _at(mypy_lines, 18)
    assert "Sequence[TypedDict(harness._core.records.HolderRecord" in _at(mypy_lines, 19)


def test_the_signature_the_type_checker_sees_lists_every_field_of_rules():
    """``Rules`` declares, for type checkers only, the forms a caller may give: its parameters
    are the dataclass's fields, in order, with the same defaults."""
    import ast
    import dataclasses

    from harness._verdict.options import Rules

    tree = ast.parse((ROOT / "harness" / "_verdict" / "options.py").read_text())
    rules = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Rules")
    typed = next(
        node
        for block in rules.body
        if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
        for node in block.body
        if isinstance(node, ast.FunctionDef) and node.name == "__init__"
    )
    arguments = typed.args.args[1:] + typed.args.kwonlyargs
    names = [a.arg for a in arguments]
    assert names == [f.name for f in dataclasses.fields(Rules)]
    defaults = dict(zip(reversed(names), reversed(typed.args.defaults), strict=False))
    defaults.update(
        (a.arg, d) for a, d in zip(typed.args.kwonlyargs, typed.args.kw_defaults, strict=True)
    )
    for f in dataclasses.fields(Rules):
        if f.default is not dataclasses.MISSING and ast.unparse(defaults[f.name]) != "...":
            assert ast.literal_eval(defaults[f.name]) == f.default, f.name

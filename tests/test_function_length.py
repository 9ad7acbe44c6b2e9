"""No function or method of ``harness`` or ``tft`` is longer than :data:`LIMIT` lines: a longer
one is split into named steps. A function's length runs from its ``def`` (decorators left out)
to its last line, docstring and comments included."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 80


Function = ast.FunctionDef | ast.AsyncFunctionDef


def functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, Function]]:
    """Every function and method in ``tree``, nested ones too, by qualified name."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{node.name}"
            if not isinstance(node, ast.ClassDef):
                yield name, node
            yield from functions(node, f"{name}.")
        else:
            yield from functions(node, prefix)


def too_long(source: str, module: str) -> list[tuple[str, int]]:
    """The functions of one module's ``source`` longer than :data:`LIMIT`, each as
    ``module:qualname`` with its length in lines."""
    found = []
    for name, node in functions(ast.parse(source, filename=module)):
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        if length > LIMIT:
            found.append((f"{module}:{name}", length))
    return found


def test_a_function_is_measured_from_its_def_to_its_last_line() -> None:
    body = "".join(f"        x{i} = {i}\n" for i in range(LIMIT - 1))
    source = (
        f"class Outer:\n    @staticmethod\n    def fits():\n{body}\n"
        f"    def grows(self):\n{body}        def inner():\n            pass\n"
    )
    assert too_long(source, "m.py") == [("m.py:Outer.grows", LIMIT + 2)]


def test_no_function_is_longer_than_the_limit() -> None:
    offenders = [
        f"{name} ({length} lines)"
        for package in ("harness", "tft")
        for path in sorted((ROOT / package).rglob("*.py"))
        for name, length in too_long(path.read_text(), path.relative_to(ROOT).as_posix())
    ]
    assert not offenders, f"longer than {LIMIT} lines, to split into named steps: {offenders}"

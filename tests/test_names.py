"""Each public name is defined in one harness module (a re-export of the same object is fine):
two rooms that both define ``Outcome`` or ``scope`` make a reader ask which one is meant."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

HARNESS = Path(__file__).resolve().parent.parent / "harness"
ALLOWED = 2
"""How many public names may still be defined in more than one module."""


def public_definitions() -> dict[str, list[str]]:
    """Each public name defined at a module's top level, with the modules that define it."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(HARNESS.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            else:
                names = []
            for name in names:
                if not name.startswith("_"):
                    found[name].append(str(path.relative_to(HARNESS.parent)))
    return found


def test_public_names_are_defined_once():
    twice = {name: where for name, where in public_definitions().items() if len(where) > 1}
    assert len(twice) <= ALLOWED, twice

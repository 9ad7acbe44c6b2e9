"""Statuses are enum members wherever the harness decides or writes one: no string literal
spells a status outside ``harness/_verdict/model.py``, which declares them."""

import ast
from pathlib import Path

from harness._verdict.model import CheckStatus, Status

HARNESS = Path(__file__).resolve().parents[1] / "harness"
SPELLED = {member.value for member in (*Status, *CheckStatus)}


def test_no_status_is_spelled_as_text():
    found = [
        f"{path.relative_to(HARNESS.parent)}:{node.lineno} {node.value!r}"
        for path in sorted(HARNESS.rglob("*.py"))
        if path != HARNESS / "_verdict" / "model.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value in SPELLED
    ]
    assert found == []

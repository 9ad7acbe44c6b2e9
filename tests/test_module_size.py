"""Every module of ``harness`` and ``tft`` stays under 500 lines: a module past that is split
by what it owns."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 500


def test_every_module_is_under_500_lines():
    long = {
        str(path.relative_to(ROOT)): lines
        for package in ("harness", "tft")
        for path in sorted((ROOT / package).rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) >= LIMIT
    }
    assert long == {}

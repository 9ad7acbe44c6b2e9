"""The README says what is true: its options table is the one the fields' metadata make, its
example test fails as the output shown says (numbers aside), and passes once fixed."""

import re
import tomllib
from pathlib import Path

from harness._verdict.options import options_table

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def between(start: str, end: str) -> str:
    """The README's text between the line holding ``start`` and the next holding ``end``."""
    after = README[README.index(start) :].split("\n", 1)[1]
    return after[: after.index(end)].rstrip("\n")


def fenced(text: str) -> str:
    """The first fenced block's body in ``text``."""
    return re.search(r"```[a-z]*\n(.*?)\n```", text, re.S)[1]


def test_the_options_table_is_generated_from_the_fields():
    assert between("<!-- options:", "<!-- end options -->") == "\n".join(options_table())


def test_the_install_lines_name_this_distribution():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "pytest-leakgate"
    assert f"`{project['name']}`" in README
    assert "nox -s gpu_leak" in README and "nox -s tests" in README


def shown_as_pattern(line: str) -> re.Pattern[str]:
    """A shown output line as a pattern: each number may read otherwise on another machine."""
    parts = re.split(r"\d+(?:\.\d+)?(?:e-?\d+)?", line)
    return re.compile(r"\s*" + r"[\d.e-]+".join(map(re.escape, parts)).strip() + r"\s*$")


def test_the_example_fails_as_shown_and_passes_fixed(pytester):
    example = fenced(between("<!-- example:", "```bash"))
    shown = fenced(between("<!-- output -->", "<!-- end output -->")).splitlines()
    pytester.makepyfile(test_validation=example)
    result = pytester.runpytest("-p", "no:randomly", "--memreport=reports", "test_validation.py")
    result.assert_outcomes(failed=1)
    printed = result.stdout.lines
    for line in shown:
        pattern = shown_as_pattern(line)
        assert any(pattern.match(out) for out in printed), (line, result.stdout.str())
    assert (pytester.path / "reports" / "index.md").is_file()

    fixed = example.replace("losses.append(loss)", "losses.append(loss.item())")
    assert fixed != example
    pytester.makepyfile(test_validation=fixed)
    result = pytester.runpytest("-p", "no:randomly", "--memreport=reports", "test_validation.py")
    result.assert_outcomes(passed=1)

"""``index.md`` is the gate's decision: parsed as a reader sees it, it agrees with the gate's exit
code over the gate's cases (clean, FAIL, regression only, missing, stale, incomplete, empty)."""

import re
from dataclasses import dataclass, field

import pytest
from markdown_it import MarkdownIt
from test_cli import clean, growing, run_with_id, saved
from test_report import incident

from harness._frontends.cli import main

PARSER = MarkdownIt("commonmark").enable("table")


@dataclass
class Page:
    """What ``index.md`` says once rendered: the gate's verdict (None when no gate decided), its
    first paragraph, the items of each section, the Verdict cell of each table row, and the
    totals' counts."""

    gate: str | None = None
    opening: str = ""
    sections: dict[str, list[str]] = field(default_factory=dict)
    rows: list[str] = field(default_factory=list)
    totals: dict[str, int] = field(default_factory=dict)


def shown(inline):
    """An inline token as a reader sees it: its text and code, escapes resolved."""
    return "".join(
        " " if c.type == "softbreak" else c.content
        for c in inline.children
        if c.type in ("text", "code_inline", "softbreak")
    )


def read_page(markdown):
    """The page parsed by markdown-it, as a reader sees it."""
    page = Page()
    tokens = PARSER.parse(markdown)
    section = None
    cell = None
    for i, token in enumerate(tokens):
        if token.type != "inline":
            if token.type == "td_open":
                cell = 0 if tokens[i - 1].type == "tr_open" else (cell or 0) + 1
            continue
        said, before = shown(token), tokens[i - 1]
        if before.type == "heading_open" and before.tag == "h2":
            section = page.sections.setdefault(said, [])
        elif before.type == "td_open" and cell == 0:
            page.rows.append(said)
        elif before.type == "paragraph_open" and tokens[i - 2].type == "list_item_open":
            section.append(said)
        elif before.type == "paragraph_open":
            page.opening = page.opening or said
            if gate := re.match(r"Gate: (\w+):", said):
                page.gate = gate[1]
            elif totals := re.match(r"\d+ traced runs?: (\d+ \w+(?: · \d+ \w+)*)", said):
                page.totals = {s: int(n) for n, s in re.findall(r"(\d+) (\w+)", totals[1])}
    return page


def gate(folder, baseline=None):
    args = ["gate", str(folder)] + (["--baseline", str(baseline)] if baseline else [])
    return main(args)


def case_clean(runs, baseline):
    saved(baseline, "a", growing(0.25))
    saved(runs, "a", growing(0.255))


def case_fail(runs, baseline):
    saved(baseline, "a", growing(0.25))
    saved(runs, "a", growing(0.25))
    saved(baseline, "b", incident())
    saved(runs, "b", incident())


def case_regression(runs, baseline):
    saved(baseline, "a", growing(0.25))
    saved(runs, "a", growing(0.3))


def case_missing(runs, baseline):
    saved(baseline, "a", clean())
    saved(baseline, "gone", clean())
    saved(runs, "a", clean())


def case_stale(runs, baseline):
    saved(baseline, "a", clean())
    saved(runs, "a", clean())
    run_with_id(runs, "a", clean(), "2" * 32)


def case_incomplete(runs, baseline):
    saved(baseline, "a", clean())
    timeline = run_with_id(runs, "a", clean()[:40], "3" * 32)
    assert main(["report", str(timeline)]) in (0, 1)


def case_empty(runs, baseline):
    saved(baseline, "a", clean())


CASES = {  # exit code, the rows' verdicts, the problems, the verdicts regressed
    "clean": (case_clean, 0, {"PASS"}, [], set()),
    "fail": (case_fail, 1, {"PASS", "FAIL"}, [], set()),
    "regression": (case_regression, 1, {"REGRESSION"}, [], {"a.json"}),
    "missing": (case_missing, 1, {"PASS"}, ["missing from the run: gone.json"], set()),
    "stale": (case_stale, 1, {"PASS"}, ["stale verdict: a.json is from run "], set()),
    "incomplete": (
        case_incomplete,
        1,
        {"ERROR"},
        ["incomplete run: a.jsonl ended at "],
        {"a.json"},
    ),
    "empty": (case_empty, 2, set(), [], set()),
}


@pytest.mark.parametrize("name", CASES)
def test_the_index_says_what_the_gate_decided(tmp_path, capsys, name):
    build, expected, verdicts, problems, regressions = CASES[name]
    runs, baseline = tmp_path / "runs", tmp_path / "baseline"
    runs.mkdir(), baseline.mkdir()
    build(runs, baseline)
    capsys.readouterr()
    code = gate(runs, baseline)
    printed = capsys.readouterr().out.splitlines()
    assert code == expected
    page = read_page((runs / "index.md").read_text())
    if code == 2:
        assert page.gate == "REFUSED" and not page.rows
        return
    assert page.gate == ("PASS" if code == 0 else "FAIL") == printed[-1].split(":")[1].strip()
    assert set(page.rows) == verdicts
    assert page.totals == {s: page.rows.count(s) for s in ("PASS", "REGRESSION", "FAIL", "ERROR")}
    shown = page.sections.get("Problems", [])
    assert len(shown) == len(problems) and all(
        line.startswith(problem) for line, problem in zip(shown, problems, strict=True)
    )
    assert all(line in printed for line in shown)
    regressed = page.sections.get("Regressions against the baseline", [])
    assert {line.split(":")[0] for line in regressed} == regressions
    assert (code == 0) == (set(page.rows) == {"PASS"} and not shown and not regressed)


def test_a_regression_is_listed_with_its_phase_metric_values_and_tolerance(tmp_path, capsys):
    runs, baseline = tmp_path / "runs", tmp_path / "baseline"
    runs.mkdir(), baseline.mkdir()
    case_regression(runs, baseline)
    assert gate(runs, baseline) == 1
    page = read_page((runs / "index.md").read_text())
    assert f"against the baseline {baseline} (tolerance 10% and " in page.opening
    reasons = page.sections["Regressions against the baseline"]
    growth = next(r for r in reasons if "growth" in r)
    assert re.fullmatch(
        r"a\.json: validation epoch 0 growth \(allocated\): \S+ -> \S+, more than 10% and "
        r"\S+ allowed",
        growth,
    )
    assert page.rows == ["REGRESSION"] and page.totals["PASS"] == 0


@pytest.mark.parametrize("landed", ["{not json", '{"schema_version": 1}'])
def test_a_refused_gate_leaves_no_index_that_says_the_earlier_pass(tmp_path, capsys, landed):
    saved(tmp_path, "a", clean())
    assert gate(tmp_path) == 0
    assert read_page((tmp_path / "index.md").read_text()).gate == "PASS"
    (tmp_path / "broken.json").write_text(landed)
    assert gate(tmp_path) == 2
    page = read_page((tmp_path / "index.md").read_text())
    assert page.gate == "REFUSED" and not page.rows and "broken.json" in page.opening


def test_a_gate_refused_for_its_baseline_says_so_in_the_index(tmp_path, capsys):
    saved(tmp_path, "a", clean())
    assert gate(tmp_path) == 0
    assert gate(tmp_path, tmp_path / "no-such-baseline") == 2
    page = read_page((tmp_path / "index.md").read_text())
    assert page.gate == "REFUSED" and "no-such-baseline" in page.opening


def test_the_index_alone_says_no_baseline_was_compared(tmp_path, capsys):
    saved(tmp_path, "a", growing(0.3))
    assert main(["index", str(tmp_path)]) == 0
    page = read_page((tmp_path / "index.md").read_text())
    assert page.gate is None and page.rows == ["PASS"] and not page.sections
    assert page.opening.startswith("No baseline was compared")
    assert "REGRESSION" not in page.totals

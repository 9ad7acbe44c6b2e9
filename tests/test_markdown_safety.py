"""Reports and the index stay inert markdown whatever text a run carries.

Each property renders one timeline twice: once with plain names, once with arbitrary text
(control characters, HTML, links, backticks, pipes, newlines) for every test id, title,
phase, label, note, error, holder path and header value. Parsed with markdown-it, both give
the same document structure: as many headings and table rows, the same links (ours), and no
HTML, image, emphasis or code block that the plain one does not have.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from functools import cache

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from harness._core.markdown import code, fenced, link_to, mermaid, plain, spans, table, text
from harness._measure.sample import Sample
from harness._report.chart import memory_chart
from harness._report.run import Run
from harness._report.sections import render_report
from harness._results.artifacts import save_run, write_index
from harness._rules.judging import judge

MB = 2**20
PARSER = MarkdownIt("commonmark").enable(["table", "strikethrough"])
HOSTILE = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "[click](http://evil.example/x)",
    "![i](http://evil.example/i.png)",
    "<http://evil.example>",
    "a\nb\r\n# heading\n| x | y |\n|---|---|",
    "```\n~~~",
    "`code` and ``more``",
    "pipe | pipe \\| pipe \\\\| end\\",
    "nul\x00and\x01bell\x07\x1b[31m",
    "**bold** _em_ ~~gone~~ $x$",
    "&lt;entity&gt; &amp; &#x3C;",
    "#",
    "\u202eevil\u2066",
]
# Text hypothesis may draw, control and line-break characters included; surrogates excluded.
hostile_text = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=40),
    st.text(st.sampled_from("<>[]()!`*_~|\\#&$:\n\r\x00 ax"), max_size=30),
)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def structure(markdown: str) -> Counter[str]:
    """Token types of the parsed document, inline ones included (plain text and inline code
    left out: hostile text may turn a code span into escaped text)."""
    counts: Counter[str] = Counter()
    for token in PARSER.parse(markdown):
        counts[token.type] += 1
        for child in token.children or ():
            if child.type not in ("text", "code_inline", "softbreak"):
                counts[child.type] += 1
    return counts


def links(markdown: str) -> list[str]:
    found = []
    for token in PARSER.parse(markdown):
        for child in token.children or ():
            if child.type == "link_open":
                found.append(str(child.attrGet("href")))
    return found


def assert_inert(markdown: str, baseline: str) -> None:
    got, want = structure(markdown), structure(baseline)
    assert not {"html_block", "html_inline", "image"} & set(got)
    assert got == want
    assert all(":" not in href and not href.startswith("//") for href in links(markdown))
    html = PARSER.render(markdown)
    assert "<script" not in html and "<img" not in html


def names(words):
    """Distinct roles for one text each, none of them a label or note the rules act on."""
    test_id, title, phase_a, phase_b, label, note, error, path, device, notes, timeline = words
    note = "n " + note
    return {
        "test": test_id,
        "title": "T " + title,
        "train": "t" + phase_a,
        "val": "v" + phase_b,
        "label": "X" + label,
        "note": note,
        "error": "E " + error,
        "path": path or "p",
        "device": device,
        "notes": notes,
        "timeline": "tl" + timeline,
    }


PLAIN = names(["t.py::test", "title", "A", "B", "LOOP", "note", "boom", "Tr.x", "dev", "n", "x"])


def run_with(n):
    train, val, loop = n["train"], n["val"], n["label"]

    def at(mb, label, phase, batch=None, **extra):
        return Sample(label, phase, 0, batch, 1.0, {"allocated": round(mb * MB)}, **extra)

    samples = [
        Sample("SESSION_START", "session", None, None, 1.0, {"allocated": 1000 * MB}),
        *(at(1100, loop, train, b) for b in range(12)),
        at(1100, "CHECK_FAILED", train, note=n["note"]),
        *(at(1100 + 2 * b, loop, val, b, note=n["note"] if b == 3 else None) for b in range(12)),
        at(1124, "OOM", val, 12, note="out of memory"),
    ]
    rules = {"phase": (train, val), "max_growth": "4MiB", "max_peak": "1GiB", "warmup": 2}
    verdict = replace(judge(samples, rules), error=n["error"])
    header = {
        "probe": "cuda:0",
        "device": n["device"],
        "capacity": 2048 * MB,
        "started": 1_700_000_000.0,
        "notes": [n["notes"]],
        "config": {"batch_size": 1, "c" + n["notes"]: n["device"]},
        "meta": {"test": n["test"], "faults": [n["note"]]},
    }
    holder = {"path": n["path"], "phase": val, "bytes": MB, "sites": [n["path"]]}
    run = Run(n["test"] or "r", header, samples, verdict, n["title"], [holder], 0, n["timeline"])
    return replace(run, verdict_file=n["timeline"] + ".json")


@cache
def plain_report():
    return render_report(run_with(PLAIN))


@pytest.mark.parametrize("hostile", HOSTILE)
def test_each_known_attack_renders_as_text(hostile):
    words = names([hostile] * 11)
    assert_inert(render_report(run_with(words)), plain_report())


@SETTINGS
@given(st.lists(hostile_text, min_size=11, max_size=11))
def test_a_report_keeps_its_structure_whatever_the_text(words):
    words = names(words)
    assert_inert(render_report(run_with(words)), plain_report())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_text, hostile_text, hostile_text)
@example("<script>x</script> | `a`", "[x](http://e)", "\n# h\x00")
def test_an_index_keeps_its_structure_whatever_the_text(tmp_path_factory, test_id, title, phase):
    def index(test, title, phase):
        folder = tmp_path_factory.mktemp("index")
        samples = [
            Sample("B", "v" + phase, 0, b, 1.0, {"allocated": (1000 + 2 * b) * MB})
            for b in range(12)
        ]
        header = {"started": 1.0, "meta": {"test": test}}
        recorder = type("R", (), {"samples": samples, "header": header})()
        save_run(folder, "leaky", recorder, judge(samples, {"max_growth": "1MiB"}), title=title)
        save_run(folder, "other", recorder, judge(samples, {"max_growth": "1GiB"}), title=title)
        return write_index(folder).read_text()

    if not PLAIN_INDEX:
        PLAIN_INDEX.append(index("t.py::x", "title", "p"))
    assert_inert(index(test_id, title, phase), PLAIN_INDEX[0])


PLAIN_INDEX: list[str] = []


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_misspelt_phase_renders_as_text_in_its_configuration_error(hostile):
    def report(phase):
        run = run_with(PLAIN)
        return render_report(replace(run, verdict=judge(run.samples, {"phase": phase})))

    assert_inert(report("v" + hostile), report("vB_"))


def test_an_absurdly_long_test_id_is_shortened_with_an_ellipsis():
    huge = "x" * 50_000_000
    report = render_report(run_with(names([huge, *["a"] * 10])))
    assert len(report) < 200_000 and "x" * 20 + "\u2026" in report


def test_the_pieces():
    assert text("a_b _c_ *d* [e](f) <g> `h` | i # j #") == (
        "a_b \\_c\\_ \\*d\\* \\[e\\](f) \\<g\\> \\`h\\` \\| i # j \\#"
    )
    assert code("a`b") == "``a`b``" and code("`a") == "`` `a ``" and code("a|b") == "a\\|b"
    assert plain("a\n\x00b\u202e", 10) == "a \ufffdb\ufffd" and plain("abcdef", 4) == "abc\u2026"
    assert link_to("x y.md", "x y.md") == "[x y.md](x%20y.md)"
    assert link_to("j", "javascript:alert(1)") == "[j](javascript%3Aalert%281%29)"
    assert link_to("r", "//evil/x") == "[r](./evil/x)"
    assert fenced("text", ["a ``` b", "c\nd"]) == ["````text", "a ``` b", "c d", "````"]
    assert table(["a|b"], [[text("x|y")]]) == ["| a\\|b |", "|---|", "| x\\|y |"]
    assert mermaid('a"b<c>`#;') == "a#quot;b#lt;c#gt;#96;#35;#59;"
    assert spans("the rule `a_b` matched *x* `c|d` ") == "the rule `a_b` matched \\*x\\* c\\|d"
    assert spans("one ` alone") == "one \\` alone"
    assert memory_chart({"m": [1, 2]}, title='x" --> y')[2] == '    title "x#quot; --#gt; y"'

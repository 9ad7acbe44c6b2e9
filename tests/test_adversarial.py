"""Hostile files and folders: a full disk, planted links, a second run in the same folder,
outputs that name inputs, and malformed or generated documents fed to every command."""

import contextlib
import errno
import io
import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cli import clean, write_timeline
from test_report import HEADER, RULES, incident

from harness import Recorder
from harness._core import fsio
from harness._frontends.cli import main
from harness._results.artifacts import write_index
from harness._results.finish import finish_run
from harness._timeline.jsonl import TimelineWriter, read_timeline

MB = 2**20


def full_disk_after(monkeypatch, budget):
    """Make ``os.write`` accept ``budget`` bytes in all, then fail with ENOSPC, as the space a
    timeline reserves for its lines (``posix_fallocate``) does once they are spent."""
    real, real_reserve = os.write, os.posix_fallocate
    left = [budget]

    def reserve(fd, offset, length):
        if left[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_reserve(fd, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", reserve)

    def write(fd, data):
        if left[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written = real(fd, bytes(data)[: left[0]])
        left[0] -= written
        return written

    monkeypatch.setattr(os, "write", write)


# -- atomic writes ---------------------------------------------------------------------------


def test_write_atomic_replaces_the_file_whole(tmp_path):
    path = tmp_path / "v.json"
    path.write_text("old")
    assert fsio.write_atomic(path, "new ü") == path
    assert path.read_text() == "new ü" and os.listdir(tmp_path) == ["v.json"]
    assert path.stat().st_mode & 0o777 == fsio.file_mode()


def test_a_full_disk_keeps_the_old_file_and_names_the_target(tmp_path, monkeypatch):
    path = tmp_path / "v.json"
    path.write_text("previous verdict")
    full_disk_after(monkeypatch, 3)
    with pytest.raises(OSError) as raised:
        fsio.write_atomic(path, "a new verdict, longer than three bytes")
    monkeypatch.undo()
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(path)
    assert path.read_text() == "previous verdict" and os.listdir(tmp_path) == ["v.json"]


def test_report_on_a_full_disk_keeps_the_previous_verdict_and_report(tmp_path, monkeypatch, capsys):
    timeline = write_timeline(tmp_path / "run.jsonl", clean())
    assert main(["report", str(timeline)]) == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    capsys.readouterr()
    full_disk_after(monkeypatch, 0)
    code = main(["report", str(timeline), "-o", str(tmp_path / "run.md"), "--title", "changed"])
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert f"{tmp_path / 'run.json'}: cannot write (No space left on device)" in err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_link_planted_at_an_output_is_replaced_never_written_through(tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("keep")
    reports = tmp_path / "reports"
    reports.mkdir()
    for name in ("x.json", "x.md", "index.md"):
        (reports / name).symlink_to(outside)
    timeline = write_timeline(reports / "x.jsonl", clean())
    assert main(["report", str(timeline), "-o", str(reports / "x.md")]) == 0
    assert main(["index", str(reports)]) == 0
    assert outside.read_text() == "keep"
    for name in ("x.json", "x.md", "index.md"):
        assert not (reports / name).is_symlink() and (reports / name).stat().st_size > 0
    assert json.loads((reports / "x.json").read_text())["status"] == "PASS"


def test_write_atomic_into_a_missing_folder_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError) as raised:
        fsio.write_atomic(tmp_path / "no" / "v.json", "x")
    assert raised.value.filename == str(tmp_path / "no" / "v.json")


# -- the streamed timeline -------------------------------------------------------------------


def test_a_timeline_never_follows_a_planted_link(tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("keep")
    (tmp_path / "t.jsonl").symlink_to(outside)
    (tmp_path / "dangling.jsonl").symlink_to(tmp_path / "nowhere")
    for name in ("t.jsonl", "dangling.jsonl"):
        with pytest.raises(FileExistsError, match="a symbolic link is in the way") as raised:
            TimelineWriter(tmp_path / name, HEADER)
        assert raised.value.filename == str(tmp_path / name)
    assert outside.read_text() == "keep" and not (tmp_path / "nowhere").exists()


def test_a_live_runs_timeline_is_left_alone_and_the_second_run_gets_its_own(tmp_path):
    path = tmp_path / "t.jsonl"
    first = TimelineWriter(path, {**HEADER, "run_id": "a" * 32})
    first_bytes = path.read_bytes()
    second = TimelineWriter(path, {**HEADER, "run_id": "b" * 32})
    assert second.path == tmp_path / f"t.{'b' * 12}.jsonl"
    second.close()
    assert path.read_bytes() == first_bytes
    first.write(incident()[0])
    first.close()
    assert read_timeline(path).header["run_id"] == "a" * 32
    assert read_timeline(second.path).header["run_id"] == "b" * 32


def test_an_empty_file_is_taken_for_a_run_that_is_starting(tmp_path):
    (tmp_path / "t.jsonl").write_bytes(b"")
    writer = TimelineWriter(tmp_path / "t.jsonl", {"run_id": "c" * 32})
    writer.close()
    assert writer.path.name == f"t.{'c' * 12}.jsonl" and (tmp_path / "t.jsonl").read_bytes() == b""


def test_a_finished_runs_timeline_is_replaced_by_a_new_file_not_truncated(tmp_path):
    path = write_timeline(tmp_path / "t.jsonl", clean())
    with open(path, "rb") as old:
        before = old.read()
        writer = TimelineWriter(path, {**HEADER, "run_id": "d" * 32})
        writer.close()
        old.seek(0)
        assert old.read() == before
    assert writer.path == path and read_timeline(path).header["run_id"] == "d" * 32
    assert sorted(os.listdir(tmp_path)) == ["t.jsonl"]


def test_something_not_a_file_at_the_timelines_name_is_refused(tmp_path):
    (tmp_path / "t.jsonl").mkdir()
    with pytest.raises(FileExistsError, match="not a file") as raised:
        TimelineWriter(tmp_path / "t.jsonl", HEADER)
    assert raised.value.filename == str(tmp_path / "t.jsonl")


def test_a_full_disk_while_streaming_names_the_timeline(tmp_path, monkeypatch):
    writer = TimelineWriter(tmp_path / "t.jsonl", HEADER)
    full_disk_after(monkeypatch, 0)
    with pytest.raises(OSError, match="cannot write the timeline") as raised:
        writer.write(incident()[0])
    monkeypatch.undo()
    writer.close()
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(writer.path)


def test_a_header_that_cannot_be_written_leaves_no_file(tmp_path, monkeypatch):
    full_disk_after(monkeypatch, 0)
    with pytest.raises(OSError, match="cannot write the timeline"):
        TimelineWriter(tmp_path / "t.jsonl", HEADER)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []


def test_a_dropped_writer_lets_go_of_its_name(tmp_path):
    writer = TimelineWriter(tmp_path / "t.jsonl", {"run_id": "a" * 32})
    del writer
    again = TimelineWriter(tmp_path / "t.jsonl", {"run_id": "b" * 32})
    again.close()
    again.close()
    assert again.path == tmp_path / "t.jsonl" and os.listdir(tmp_path) == ["t.jsonl"]


# -- two runs, one folder --------------------------------------------------------------------


def test_two_runs_of_one_test_in_one_folder_keep_their_own_files(tmp_path):
    """Two sessions running the same test at once: each names its report after its timeline,
    so neither overwrites the other's, and the index lists both."""
    writers = [TimelineWriter(tmp_path / "t.jsonl", {**HEADER, "run_id": r * 32}) for r in "ab"]
    for writer in writers:
        for sample in clean():
            writer.write(sample)
    for writer in writers:
        finish_run(read_timeline(writer.path), name=writer.path.stem, directory=tmp_path)
        writer.close()
    names = sorted(os.listdir(tmp_path))
    assert names == sorted(
        f"{stem}{ext}" for stem in ("t", f"t.{'b' * 12}") for ext in (".json", ".jsonl", ".md")
    )
    for stem, run_id in (("t", "a" * 32), (f"t.{'b' * 12}", "b" * 32)):
        assert json.loads((tmp_path / f"{stem}.json").read_text())["run_id"] == run_id
    assert "**2 traced runs: 2 PASS" in write_index(tmp_path).read_text()
    assert main(["gate", str(tmp_path)]) == 0


def test_two_recorders_on_one_timeline_name_keep_both_runs(tmp_path):
    """What the plugin and ``tft.train`` see: the second recorder's timeline path says where
    it went, and its report and verdict take that name."""
    recorders = [Recorder("cpu", timeline=tmp_path / "t.jsonl") for _ in range(2)]
    for recorder in recorders:
        with recorder.phase("session"):
            recorder.checkpoint("TRAIN_BATCH", phase="training", batch=0)
        finish_run(recorder, name=recorder.timeline_path.stem, directory=tmp_path)
    for recorder in recorders:
        recorder.close()
    first, second = (r.timeline_path for r in recorders)
    assert first == tmp_path / "t.jsonl" and second.name == f"t.{recorders[1].run_id[:12]}.jsonl"
    for recorder in recorders:
        doc = json.loads(recorder.timeline_path.with_suffix(".json").read_text())
        assert doc["run_id"] == recorder.run_id
        assert read_timeline(recorder.timeline_path).header["run_id"] == recorder.run_id


def test_a_reader_during_a_write_sees_the_old_file_or_the_new_one(tmp_path, monkeypatch):
    """The index rebuilt while a verdict is half written still reads the previous verdict."""
    timeline = write_timeline(tmp_path / "run.jsonl", clean())
    report = str(tmp_path / "run.md")
    assert main(["report", str(timeline), "--no-json", "-o", report]) == 0
    assert main(["report", str(timeline), "-o", report]) == 0
    seen = []
    real_fsync = os.fsync

    def fsync(fd):
        if not seen:
            seen.append(None)
            seen[0] = write_index(tmp_path).read_text()
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    assert main(["report", str(timeline), "-o", report, "--title", "again"]) == 0
    monkeypatch.undo()
    assert "**1 traced run: 1 PASS" in seen[0]
    assert "not leakgate verdicts" not in seen[0]


# -- malformed documents -----------------------------------------------------------------------


def verdict_document(tmp_path):
    timeline = write_timeline(tmp_path / "v.jsonl", incident())
    assert main(["report", str(timeline)]) == 1
    return json.loads((tmp_path / "v.json").read_text())


def deep(depth):
    return "[" * depth + "]" * depth


BAD_VERDICTS = {
    "findings as an int": ("findings: expected a list, got 5", lambda d: d.update(findings=5)),
    "an unhashable phase": (
        "phases[0].phase: expected a string, got a list",
        lambda d: d["phases"][0].update(phase=["validation"]),
    ),
    "an integer beyond float range": (
        "checkpoints[0].metrics.allocated: an integer beyond a float's range",
        lambda d: d["checkpoints"][0]["metrics"].update(allocated=10**400),
    ),
    "status as a list": ("status: expected a string, got a list", lambda d: d.update(status=[])),
    "metrics as a list": (
        "checkpoints[1].metrics: expected an object, got a list",
        lambda d: d["checkpoints"][1].update(metrics=[1, 2]),
    ),
    "a checkpoint phase as a list": (
        "checkpoints[2].phase: expected a string, got a list",
        lambda d: d["checkpoints"][2].update(phase=["a"]),
    ),
    "a growth beyond float range": (
        "phases[0].growth: an integer beyond a float's range",
        lambda d: d["phases"][0].update(growth=-(10**400)),
    ),
    "a report name with a NUL": (
        "report: not a file name: 'a\\x00.md'",
        lambda d: d.update(report="a\0.md"),
    ),
    "a size rule beyond float range": (
        "rules.max_growth: an integer beyond a float's range",
        lambda d: d["rules"].update(max_growth=10**400),
    ),
    "nesting 100 deep": (
        "header.config[0][0]...: nested more than 64 levels deep",
        lambda d: d["header"].update(config=json.loads(deep(100))),
    ),
    "run.ended as text": (
        "run.ended: expected true or false, got 'yes'",
        lambda d: d["run"].update(ended="yes"),
    ),
    "header.ranks as text": (
        "header.ranks: expected a list, got 'all'",
        lambda d: d["header"].update(ranks="all"),
    ),
    "a rank's status unknown": (
        "header.ranks[0].status: expected one of PASS, FAIL, ERROR, got 'OK'",
        lambda d: d["header"].update(ranks=[{"rank": 0, "status": "OK"}]),
    ),
    "a severity unknown": (
        "findings[0].severity: expected one of P2, P1, P0, got 'P9'",
        lambda d: d["findings"][0].update(severity="P9"),
    ),
    "a NaN growth": (
        "phases[0].growth: expected a finite number, got nan",
        lambda d: d["phases"][0].update(growth=float("nan")),
    ),
    "an infinite worst growth": (
        "worst_growth: expected a finite number, got inf",
        lambda d: d.update(worst_growth=float("inf")),
    ),
    "a check status unknown": (
        "checks[0].status: expected one of SKIP, PASS, WARN, FAIL, ERROR, got 'fine'",
        lambda d: d["checks"][0].update(status="fine"),
    ),
    "a finding without its message": (
        "findings[0]: missing 'message'",
        lambda d: d["findings"][0].pop("message"),
    ),
    "held bytes as text": (
        "attribution[0].bytes: expected a whole number, got 'lots'",
        lambda d: d.update(attribution=[{"path": "x", "bytes": "lots"}]),
    ),
    "a negative torn count": (
        "run.torn: expected a whole number >= 0, got -1",
        lambda d: d["run"].update(torn=-1),
    ),
    "a custom rule option beyond float range": (
        "rules.custom.x: an integer beyond a float's range",
        lambda d: d["rules"].update(custom={"x": 10**400}),
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_VERDICTS))
@pytest.mark.parametrize("command", ["compare", "index", "gate"])
def test_a_malformed_verdict_is_one_line_naming_the_file_and_field(tmp_path, capsys, case, command):
    message, mutate = BAD_VERDICTS[case]
    doc = verdict_document(tmp_path)
    mutate(doc)
    (tmp_path / "v.json").write_text(json.dumps(doc))
    capsys.readouterr()
    argv = {
        "compare": ["compare", str(tmp_path / "v.json"), str(tmp_path / "v.json")],
        "index": ["index", str(tmp_path)],
        "gate": ["gate", str(tmp_path)],
    }[command]
    code = main(argv)
    err = capsys.readouterr().err
    if command == "index":  # the index skips what it cannot read and says how many
        assert (
            code == 0
            and "1 JSON file here is not a leakgate verdict" in (tmp_path / "index.md").read_text()
        )
        return
    assert code == 2 and err == f"error: {tmp_path / 'v.json'}: {message}\n"


def test_json_nested_100000_deep_is_one_line(tmp_path, capsys):
    (tmp_path / "deep.json").write_text(deep(100_000))
    (tmp_path / "deep.jsonl").write_text(deep(100_000) + "\n")
    assert main(["compare", str(tmp_path / "deep.json"), str(tmp_path / "deep.json")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'deep.json'}: nested too deeply\n"
    assert main(["report", str(tmp_path / "deep.jsonl")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'deep.jsonl'}:1: nested too deeply\n"


BAD_LINES = {
    "5": "sample: expected an object, got 5",
    "null": "sample: expected an object, got null",
    '"text"': "sample: expected an object, got 'text'",
    '{"label": "X", "metrics": [1, 2]}': "sample.metrics: expected an object, got a list",
    '{"label": "X", "metrics": {"allocated": 1e400}}': "sample.metrics.allocated: expected bytes",
    '{"label": "X", "metrics": {"allocated": 1' + "0" * 400 + "}}": "sample.metrics.allocated",
    '{"label": "X", "metrics": {"allocated": true}}': "sample.metrics.allocated: expected bytes",
    '{"label": "X", "phase": ["a"]}': "sample.phase: expected a string, got a list",
    '{"label": "X", "epoch": 1.5}': "sample.epoch: expected a whole number, got 1.5",
    '{"label": "X", "batch": "3"}': "sample.batch: expected a whole number, got '3'",
    '{"label": "X", "time": "now"}': "sample.time: expected a finite number, got 'now'",
    '{"label": "X", "collected": 1}': "sample.collected: expected true or false, got 1",
    '{"label": 7}': "sample.label: expected a string, got 7",
}


@pytest.mark.parametrize("line", sorted(BAD_LINES))
def test_a_malformed_timeline_line_is_one_line_naming_the_file_line_and_field(
    tmp_path, capsys, line
):
    path = write_timeline(tmp_path / "t.jsonl", clean())
    lines = path.read_text().splitlines()
    lines.insert(3, line)
    path.write_text("\n".join(lines) + "\n")
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}:4: {BAD_LINES[line]}") and err.count("\n") == 1
    assert sorted(os.listdir(tmp_path)) == ["t.jsonl"]


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ({"meta": [1]}, "header.meta: expected an object, got a list"),
        ({"rules": "strict"}, "header.rules: expected an object, got 'strict'"),
        ({"rules": {"max_growth": "1" * 400}}, "header.rules.max_growth: not a size"),
        ({"rules": {"max_peak": 2**70}}, "header.rules.max_peak: "),
        ({"capacity": 10**400}, "header.capacity: an integer beyond a float's range"),
        ({"run_id": 5}, "header.run_id: expected a string, got 5"),
        ({"leakgate_timeline": 4}, "header.leakgate_timeline: a timeline format this version "),
        ({"leakgate_timeline": "2"}, "header.leakgate_timeline: a timeline format this version "),
        ({"leakgate_timeline": 2.0}, "header.leakgate_timeline: a timeline format this version "),
    ],
)
def test_a_malformed_header_is_one_line(tmp_path, capsys, header, message):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"leakgate_timeline": 1, **header}) + "\n")
    assert main(["report", str(path)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {path}:1: {message}")


# -- every command, fuzzed ---------------------------------------------------------------------

SPECIAL = [10**400, -(10**400), 2**63, 2**64, -1, 0, 1e308, -1e308, 1.5, "", "PASS", "FAIL"]
SPECIAL += ["ERROR", "validation", "training", "session", "SESSION_END", "TEST_END", "OOM"]
SPECIAL += ["allocated", "rss", "teardown", "leak", "../x", "a\0b", "x" * 300]
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(SPECIAL)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))


def mutated(data, document):
    """``document`` with one node, picked by walking down at random, replaced by a drawn
    value (or a key dropped)."""
    doc = json.loads(json.dumps(document))
    parent, key = None, None
    node = doc
    while isinstance(node, (dict, list)) and node and data.draw(st.booleans()):
        key = data.draw(
            st.sampled_from(sorted(node) if isinstance(node, dict) else range(len(node)))
        )
        parent, node = node, node[key]
    if parent is None:
        return data.draw(values) if data.draw(st.booleans()) else doc
    if isinstance(parent, dict) and data.draw(st.integers(0, 5)) == 0:
        del parent[key]
    else:
        parent[key] = data.draw(values)
    return doc


def run_main(argv):
    """``main(argv)`` with its output captured: (exit code, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue()


def assert_outcome(code, err):
    assert code in (0, 1, 2)
    if code == 2:
        assert err.startswith("error: ") and err.count("\n") == 1, err


_BASE = {}


def base_documents():
    """A failing verdict, a passing one and a timeline's lines, made once."""
    if not _BASE:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder)
            header = {**HEADER, "run_id": "f" * 32, "meta": {"test": "t::x", "rules": RULES}}
            for name, samples in (("fail", incident()), ("pass", clean())):
                writer = TimelineWriter(path / f"{name}.jsonl", header)
                for sample in samples:
                    writer.write(sample)
                writer.close()
                run_main(["report", str(path / f"{name}.jsonl")])
                _BASE[name] = json.loads((path / f"{name}.json").read_text())
            for name in ("fail", "pass"):
                text = (path / f"{name}.jsonl").read_text()
                _BASE[f"{name} lines"] = [json.loads(x) for x in text.splitlines()]
    return _BASE


def write_json(path, doc):
    path.write_text(json.dumps(doc))


@given(st.data())
@FUZZ
def test_fuzz_report(data):
    docs = base_documents()
    records = list(docs[data.draw(st.sampled_from(["fail lines", "pass lines"]))])
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(records) - 1))
        records[at] = mutated(data, records[at])
    text = "\n".join(json.dumps(r) for r in records) + "\n"
    if data.draw(st.booleans()):
        text += data.draw(st.sampled_from(['{"label": "VALIDA', "[[[", "\x00", "5"]))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.jsonl"
        path.write_text(text)
        options = data.draw(
            st.sampled_from([[], ["-o", "-"], ["--max-growth", "1KB"], ["--no-json"]])
        )
        with contextlib.redirect_stdout(io.StringIO()):
            assert_outcome(*run_main(["report", str(path), *options]))
        assert path.read_text() == text


@given(st.data())
@FUZZ
def test_fuzz_compare(data):
    docs = base_documents()
    with tempfile.TemporaryDirectory() as folder:
        base, new = Path(folder) / "base.json", Path(folder) / "new.json"
        write_json(base, mutated(data, docs[data.draw(st.sampled_from(["fail", "pass"]))]))
        write_json(new, mutated(data, docs[data.draw(st.sampled_from(["fail", "pass"]))]))
        assert_outcome(*run_main(["compare", str(base), str(new)]))
        assert_outcome(*run_main(["compare", str(new), str(base), "--min-bytes", "0"]))


@given(st.data())
@FUZZ
def test_fuzz_index(data):
    docs = base_documents()
    with tempfile.TemporaryDirectory() as folder:
        for name in ("a", "b"):
            write_json(Path(folder) / f"{name}.json", mutated(data, docs["fail"]))
        assert_outcome(*run_main(["index", folder]))


@given(st.data())
@FUZZ
def test_fuzz_gate(data):
    docs = base_documents()
    with tempfile.TemporaryDirectory() as folder:
        runs, baseline = Path(folder) / "runs", Path(folder) / "baseline"
        runs.mkdir(), baseline.mkdir()
        write_json(runs / "a.json", mutated(data, docs["pass"]))
        write_json(baseline / "a.json", mutated(data, docs["pass"]))
        records = list(docs["pass lines"])
        at = data.draw(st.integers(0, len(records) - 1))
        records[at] = mutated(data, records[at])
        (runs / "a.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
        assert_outcome(*run_main(["gate", str(runs), "--baseline", str(baseline)]))

"""``python -m harness``: report, compare and index; exit codes 0, 1 and 2."""

import json
import subprocess
import sys

import pytest
from test_report import HEADER, RULES, incident

from harness.cli import main
from harness.sample import Sample
from harness.timeline import TimelineWriter

MB = 2**20


def write_timeline(path, samples, *, rules=RULES, torn=b""):
    header = {**HEADER, "meta": {**HEADER["meta"], "test": "t.py::test_x", "rules": rules}}
    writer = TimelineWriter(path, header)
    for s in samples:
        writer.write(s)
    writer.close()
    if torn:
        with open(path, "ab") as f:
            f.write(torn)
    return path


def clean():
    samples = [s for s in incident() if s.label != "VALIDATION_BATCH"]
    batches = [
        Sample("VALIDATION_BATCH", "validation", 0, b, 1.0, {"allocated": 1611 * MB})
        for b in range(40)
    ]
    return samples[:25] + batches + samples[25:]


def test_report_judges_by_the_header_rules_and_writes_markdown_and_json(tmp_path, capsys):
    timeline = write_timeline(tmp_path / "runs" / "leaky.jsonl", incident())
    out = tmp_path / "out" / "leaky.md"
    assert main(["report", str(timeline), "-o", str(out)]) == 1
    printed = capsys.readouterr().out
    assert (
        printed.startswith("FAIL: 1 finding(s), worst leak +") and f"; wrote {out} and " in printed
    )
    text = out.read_text()
    assert text.startswith("# Memory report: t.py::test_x\n")
    assert "(P0): Leak in validation epoch 0" in text and "max_growth 20.0MB" in text
    assert (
        "[../runs/leaky.jsonl](../runs/leaky.jsonl)" in text and "[leaky.json](leaky.json)" in text
    )
    doc = json.loads(out.with_suffix(".json").read_text())
    assert doc["status"] == "FAIL" and doc["rules"]["max_growth"] == 20 * MB
    assert doc["timeline"] == "../runs/leaky.jsonl" and doc["report"] == "leaky.md"


def test_report_options_override_the_header_rules_and_default_beside_the_timeline(tmp_path):
    timeline = write_timeline(tmp_path / "leaky.jsonl", incident())
    assert main(["report", str(timeline), "--max-growth", "100MB", "--title", "Relaxed"]) == 0
    text = (tmp_path / "leaky.md").read_text()
    assert text.startswith("# Memory report: Relaxed\n") and "max_growth 95.4MB" in text
    assert json.loads((tmp_path / "leaky.json").read_text())["status"] == "PASS"


def test_report_without_stored_rules_uses_the_options(tmp_path):
    timeline = write_timeline(tmp_path / "t.jsonl", incident(), rules=None)
    assert main(["report", str(timeline), "--no-json"]) == 0
    assert main(["report", str(timeline), "--no-json", "--max-growth", "1MB"]) == 1
    assert (
        main(["report", str(timeline), "--no-json", "--phase", "training", "--max-growth", "1MB"])
        == 0
    )
    assert not (tmp_path / "t.json").exists()


def test_a_killed_run_with_a_torn_last_line_still_reports(tmp_path, capsys):
    samples = incident(val_batches=30)[:-4]  # no VALIDATION_END, EPOCH_END, SESSION_END
    timeline = write_timeline(tmp_path / "killed.jsonl", samples, torn=b'{"label":"VALIDA')
    assert main(["report", str(timeline)]) == 1
    assert "1 torn line skipped" in capsys.readouterr().out
    text = (tmp_path / "killed.md").read_text()
    assert "timeline cut short (torn last line skipped)" in text
    assert "0 of 1 epochs completed" in text and "before the end of the run" in text
    assert "1 torn last line skipped: the writer was killed mid-line" in text
    assert json.loads((tmp_path / "killed.json").read_text())["run"]["torn"] == 1


def test_report_to_stdout(tmp_path, capsys):
    timeline = write_timeline(tmp_path / "c.jsonl", clean())
    assert main(["report", str(timeline), "-o", "-"]) == 0
    captured = capsys.readouterr()
    assert (
        captured.out.startswith("# Memory report: ") and "ALL CHECKS PASSING: YES" in captured.out
    )
    assert captured.err.startswith("PASS: 0 finding(s)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]


def saved(tmp_path, name, samples, scale=1.0):
    timeline = write_timeline(tmp_path / f"{name}.jsonl", samples)
    assert main(["report", str(timeline)]) in (0, 1)
    path = tmp_path / f"{name}.json"
    doc = json.loads(path.read_text())
    for point in doc["checkpoints"]:
        if point["label"] == "AFTER_VALIDATION":
            point["metrics"]["allocated"] = round(point["metrics"]["allocated"] * scale)
    path.write_text(json.dumps(doc))
    return str(path)


def test_compare_exits_1_on_a_20_percent_growth_and_prints_a_table(tmp_path, capsys):
    base = saved(tmp_path, "base", clean())
    new = saved(tmp_path, "new", clean(), scale=1.2)
    capsys.readouterr()
    assert main(["compare", base, new, "--tolerance", "10%"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("compare: REGRESSION: 1 of ")
    assert lines[1].split() == ["value", "metric", "base", "new", "change"]
    assert lines[2].split() == [
        "Epoch",
        "0",
        "AFTER_VALIDATION",
        "allocated",
        "1611.0MB",
        "1933.2MB",
        "+322.2MB",
        "(+20.0%)",
        "REGRESSION",
    ]
    assert main(["compare", base, new, "--tolerance", "25"]) == 0


def test_compare_ignores_a_2_percent_wobble_and_a_regressed_status_fails(tmp_path, capsys):
    base = saved(tmp_path, "base", clean())
    wobble = saved(tmp_path, "wobble", clean(), scale=1.02)
    capsys.readouterr()
    assert main(["compare", base, wobble]) == 0
    out = capsys.readouterr().out
    assert out.startswith("compare: OK: 0 of ") and "largest changes, all within tolerance:" in out
    leaky = saved(tmp_path, "leaky", incident())
    capsys.readouterr()
    assert main(["compare", base, leaky]) == 1
    assert "status PASS -> FAIL (a regression)" in capsys.readouterr().out


def test_index_command(tmp_path, capsys):
    saved(tmp_path, "a", clean())
    assert main(["index", str(tmp_path)]) == 0
    assert "**1 traced run: 1 PASS" in (tmp_path / "index.md").read_text()
    assert main(["index", str(tmp_path / "missing")]) == 2


def test_gate_fails_on_a_failing_verdict_or_a_regression_and_passes_otherwise(tmp_path, capsys):
    runs, baseline = tmp_path / "runs", tmp_path / "baseline"
    runs.mkdir(), baseline.mkdir()
    saved(baseline, "a", clean())
    saved(runs, "a", clean(), scale=1.02)
    assert main(["gate", str(runs), "--baseline", str(baseline)]) == 0
    assert (runs / "index.md").is_file()
    assert capsys.readouterr().out.splitlines()[-1] == "gate: PASS: 0 of 1 verdicts fail"

    saved(runs, "a", clean(), scale=1.2)
    assert main(["gate", str(runs), "--baseline", str(baseline)]) == 1
    out = capsys.readouterr().out
    assert "PASS  a.json (regression against the baseline)" in out and "REGRESSION" in out

    saved(runs, "a", clean())
    saved(runs, "b", incident())
    assert main(["gate", str(runs), "--baseline", str(baseline)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  b.json (no baseline)" in out and "gate: FAIL: 1 of 2 verdicts fail" in out


def test_gate_on_a_folder_without_verdicts_is_bad_input(tmp_path, capsys):
    assert main(["gate", str(tmp_path)]) == 2
    assert "no verdicts to gate" in capsys.readouterr().err


def bad_files(tmp_path):
    (tmp_path / "text.jsonl").write_text("hello\n")
    (tmp_path / "broken.jsonl").write_text('{"leakgate_timeline":1}\n{"lab\n{"label":"x"}\n')
    (tmp_path / "nolabel.jsonl").write_text('{"leakgate_timeline":1}\n{"phase":"x"}\n')
    (tmp_path / "text.json").write_text("not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "future.json").write_text('{"schema_version": 99, "status": "PASS"}')
    (tmp_path / "nostatus.json").write_text('{"schema_version": 1}')
    (tmp_path / "rules.jsonl").write_text(
        '{"leakgate_timeline":1,"meta":{"rules":{"max_growth":"lots"}}}\n'
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["report", "missing.jsonl"], "missing.jsonl: cannot read (No such file or directory)"),
        (["report", "text.jsonl"], "not a leakgate timeline"),
        (["report", "broken.jsonl"], "broken.jsonl:2: not a JSON line"),
        (["report", "nolabel.jsonl"], "sample without a label"),
        (["report", "rules.jsonl"], "rules: Rules.max_growth: cannot read 'lots'"),
        (["compare", "missing.json", "text.json"], "missing.json: cannot read"),
        (["compare", "future.json", "future.json"], "schema_version 99 is not readable"),
        (["compare", "text.json", "text.json"], "text.json: not JSON"),
        (["compare", "list.json", "list.json"], "list.json: not a leakgate verdict"),
        (["compare", "nostatus.json", "nostatus.json"], "not a leakgate verdict (no 'status')"),
    ],
)
def test_bad_input_exits_2_with_one_line_on_stderr(tmp_path, monkeypatch, capsys, args, message):
    bad_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err


@pytest.mark.parametrize("value", ["ten", "-5%", "nan"])
def test_a_bad_tolerance_is_a_usage_error(tmp_path, value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", "a.json", "b.json", "--tolerance", value])
    assert exit_info.value.code == 2 and "--tolerance" in capsys.readouterr().err


def test_python_dash_m_harness_runs_the_cli(tmp_path):
    timeline = write_timeline(tmp_path / "leaky.jsonl", incident())
    done = subprocess.run(
        [sys.executable, "-m", "harness", "report", str(timeline)], capture_output=True, text=True
    )
    assert done.returncode == 1 and (tmp_path / "leaky.md").exists(), done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "harness", "compare", str(timeline), str(timeline)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == f"error: {timeline}: not JSON"


@pytest.mark.parametrize("command", ["report", "compare", "index", "gate"])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0 and "usage: leakgate" in capsys.readouterr().out

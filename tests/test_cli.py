"""``python -m harness``: report, compare and index; exit codes 0, 1 and 2."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from test_report import HEADER, RULES, incident

from harness._core.errors import BadInput, UnwritableReport
from harness._core.units import format_mib, format_size
from harness._frontends.cli import main
from harness._measure.sample import Sample
from harness._recorder import Recorder
from harness._timeline import columns as timeline_columns
from harness._timeline.jsonl import TimelineWriter, read_timeline

MB = 2**20
ROOT = Path(__file__).resolve().parents[1]


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
    assert printed.startswith("FAIL: 1 finding, worst leak +") and f"; wrote {out} and " in printed
    text = out.read_text()
    assert text.startswith("# Memory report: t.py::test_x\n")
    assert "(P0): Leak in validation epoch 0" in text and "max_growth " in text
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
    assert text.startswith("# Memory report: Relaxed\n") and "max_growth 100MB" in text
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
    assert captured.err.startswith("PASS: 0 findings")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]


def growing(per_batch_mb, *, offset_mb=0.0):
    """A passing run whose validation loop grows ``per_batch_mb`` a batch (RULES allow 20MiB),
    every reading raised by ``offset_mb`` (what ran before it, in another test order)."""
    shift = round(offset_mb * MB)
    samples = clean()
    for i, s in enumerate(samples):
        grown = per_batch_mb * MB * s.batch if s.label == "VALIDATION_BATCH" else 0
        samples[i] = replace(
            s, metrics={"allocated": s.metrics["allocated"] + shift + round(grown)}
        )
    return samples


def saved(folder, name, samples):
    """A run's timeline, and its verdict and report (replacing those of an earlier run)."""
    timeline = write_timeline(folder / f"{name}.jsonl", samples)
    assert main(["report", str(timeline), "-o", str(folder / f"{name}.md")]) in (0, 1)
    return str(folder / f"{name}.json")


def test_compare_exits_1_on_a_20_percent_growth_and_prints_a_table(tmp_path, capsys):
    base = saved(tmp_path, "base", growing(0.25))
    new = saved(tmp_path, "new", growing(0.3))
    capsys.readouterr()
    assert main(["compare", base, new, "--tolerance", "10%"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(
        f"compare: REGRESSION: 2 of 3 values grew by more than 10% and {format_mib(MB)}"
    )
    assert lines[1].split() == ["value", "metric", "base", "new", "change"]
    growth = [format_mib(m * MB) for m in (8.5, 10.2)] + [format_mib(1.7 * MB, signed=True)]
    assert lines[2].split() == [
        "validation", "epoch", "0", "growth", "allocated", *growth, "(+20.0%)", "REGRESSION"
    ]  # fmt: skip
    assert lines[3].split()[:4] == ["validation", "epoch", "0", "slope"]
    assert lines[3].endswith(f"{format_size(51.2 * 2**10, signed=True)}/batch (+20.0%)  REGRESSION")
    assert main(["compare", base, new, "--tolerance", "25"]) == 0


def test_compare_ignores_a_2_percent_wobble_and_a_regressed_status_fails(tmp_path, capsys):
    base = saved(tmp_path, "base", growing(0.25))
    wobble = saved(tmp_path, "wobble", growing(0.255))
    capsys.readouterr()
    assert main(["compare", base, wobble]) == 0
    out = capsys.readouterr().out
    assert (
        out.startswith("compare: OK: 0 of 3 ") and "largest changes, all within tolerance:" in out
    )
    leaky = saved(tmp_path, "leaky", incident())
    capsys.readouterr()
    assert main(["compare", base, leaky]) == 1
    assert "status PASS -> FAIL (a regression)" in capsys.readouterr().out


def test_compare_ignores_levels_that_depend_on_what_ran_before(tmp_path, capsys):
    """Every checkpoint 25MB higher (another test ran first) but the same growth: no
    regression, and checkpoint levels are not among the values compared."""
    base = saved(tmp_path, "base", growing(0.25))
    later = saved(tmp_path, "later", growing(0.25, offset_mb=25.3))
    capsys.readouterr()
    assert main(["compare", base, later]) == 0
    out = capsys.readouterr().out
    assert out.startswith("compare: OK: 0 of 3 values") and "START" not in out


def test_compare_prints_no_percentage_on_a_base_near_zero(tmp_path, capsys):
    base = saved(tmp_path, "base", growing(0.0))
    new = saved(tmp_path, "new", growing(0.2))
    capsys.readouterr()
    assert main(["compare", base, new]) == 1
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if line.endswith("REGRESSION")]
    shown = [format_mib(0), format_mib(6.8 * MB), format_mib(6.8 * MB, signed=True)]
    assert rows[0].split()[3:] == ["growth", "allocated", *shown, "REGRESSION"]
    assert not any("%" in row for row in lines[1:])


def test_compare_with_nothing_in_common_is_not_ok(tmp_path, capsys):
    base = saved(tmp_path, "base", growing(0.25))
    doc = json.loads((tmp_path / "base.json").read_text())
    for phase in doc["phases"]:
        phase["phase"] = "renamed"
    (tmp_path / "other.json").write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["compare", base, str(tmp_path / "other.json")]) == 1
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "compare: NOTHING COMPARED: BASE and NEW have no judged phase or teardown check in common "
        "(0 values compared); status PASS -> PASS"
    ]


def test_index_command(tmp_path, capsys):
    saved(tmp_path, "a", clean())
    assert main(["index", str(tmp_path)]) == 0
    assert "**1 traced run: 1 PASS" in (tmp_path / "index.md").read_text()
    assert main(["index", str(tmp_path / "missing")]) == 2


def test_gate_fails_on_a_failing_verdict_or_a_regression_and_passes_otherwise(tmp_path, capsys):
    runs, baseline = tmp_path / "runs", tmp_path / "baseline"
    runs.mkdir(), baseline.mkdir()
    saved(baseline, "a", growing(0.25))
    saved(runs, "a", growing(0.255))
    assert main(["gate", str(runs), "--baseline", str(baseline)]) == 0
    assert (runs / "index.md").is_file()
    assert capsys.readouterr().out.splitlines()[-1] == "gate: PASS: 0 of 1 verdicts fail"

    saved(runs, "a", growing(0.3))
    assert main(["gate", str(runs), "--baseline", str(baseline)]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION a.json (PASS by its rules, regressed against the baseline)" in out

    saved(runs, "a", growing(0.25))
    saved(runs, "b", incident())
    assert main(["gate", str(runs), "--baseline", str(baseline)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "FAIL  b.json (no baseline)" in out and "no baseline for 1 verdict: b.json" in out
    assert out[-1] == "gate: FAIL: 1 of 2 verdicts fail"


def test_gate_on_a_folder_without_verdicts_is_bad_input(tmp_path, capsys):
    assert main(["gate", str(tmp_path)]) == 2
    assert "no verdicts to gate" in capsys.readouterr().err


def run_with_id(folder, name, samples, run_id):
    header = {**HEADER, "run_id": run_id, "meta": {"test": "t.py::test_x", "rules": RULES}}
    writer = TimelineWriter(folder / f"{name}.jsonl", header)
    for s in samples:
        writer.write(s)
    writer.close()
    return writer.path


def test_gate_fails_on_a_timeline_without_its_verdict(tmp_path, capsys):
    saved(tmp_path, "a", clean())
    run_with_id(tmp_path, "b", clean(), "b" * 32)
    assert main(["gate", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "missing verdict: b.jsonl has no b.json" in out
    assert out[-1] == "gate: FAIL: 0 of 1 verdicts fail, 1 problem"


def test_gate_fails_on_a_killed_run_beside_the_previous_runs_passing_verdict(tmp_path, capsys):
    """A run killed mid-validation leaves its new timeline beside the PASS verdict of the
    run before it: the verdict is stale and the run incomplete."""
    timeline = run_with_id(tmp_path, "a", clean(), "1" * 32)
    assert main(["report", str(timeline)]) == 0
    assert json.loads((tmp_path / "a.json").read_text())["run_id"] == "1" * 32
    assert main(["gate", str(tmp_path)]) == 0
    killed = clean()[:40]  # into the validation loop, epoch 0
    run_with_id(tmp_path, "a", killed, "2" * 32)
    capsys.readouterr()
    assert main(["gate", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-3:] == [
        f"stale verdict: a.json is from run {'1' * 32}, a.jsonl from run {'2' * 32}",
        "incomplete run: a.jsonl ended at checkpoint 40 (epoch 0)",
        "gate: FAIL: 0 of 1 verdicts fail, 2 problems",
    ]


@pytest.mark.parametrize("kind", ["missing", "file", "empty"])
def test_gate_refuses_a_baseline_that_is_not_a_folder_of_verdicts(tmp_path, capsys, kind):
    runs = tmp_path / "runs"
    runs.mkdir()
    saved(runs, "a", clean())
    baseline = tmp_path / "baseline"
    if kind == "file":
        baseline.write_text("{}")
    elif kind == "empty":
        baseline.mkdir()
    capsys.readouterr()
    assert main(["gate", str(runs), "--baseline", str(baseline)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {baseline}: baseline: ")


def test_gate_fails_when_a_baseline_verdict_is_missing_from_the_run(tmp_path, capsys):
    """A test renamed or deleted must not drop out of the gate unnoticed."""
    runs, baseline = tmp_path / "runs", tmp_path / "baseline"
    runs.mkdir(), baseline.mkdir()
    for name in ("a", "gone"):
        saved(baseline, name, clean())
    saved(runs, "a", clean())
    saved(runs, "renamed", clean())
    capsys.readouterr()
    assert main(["gate", str(runs), "--baseline", str(baseline)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "PASS  renamed.json (no baseline)" in out
    assert "no baseline for 1 verdict: renamed.json" in out
    assert f"missing from the run: gone.json is in the baseline {baseline} but not in {runs}" in out
    assert out[-1] == "gate: FAIL: 0 of 2 verdicts fail, 1 problem"


# -- outputs that are inputs ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "outputs",
    [
        ["-o", "A.jsonl"],
        ["--json", "A.jsonl"],
        ["-o", "same.json", "--json", "same.json"],
        ["-o", "A.json"],  # the verdict would default to A.json too
        ["-o", "linked/A.jsonl"],  # a folder linked to this one
        ["--json", "./sub/../A.jsonl"],
    ],
)
def test_report_refuses_an_output_that_is_its_input_and_writes_nothing(
    tmp_path, monkeypatch, capsys, outputs
):
    timeline = write_timeline(tmp_path / "A.jsonl", clean())
    (tmp_path / "sub").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path)
    before = timeline.read_bytes()
    monkeypatch.chdir(tmp_path)
    assert main(["report", "A.jsonl", *outputs]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert "input timeline" in err or "to one file" in err
    assert timeline.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["A.jsonl", "linked", "sub"]


def test_a_link_at_the_report_name_pointing_to_the_input_is_refused(tmp_path, capsys):
    timeline = write_timeline(tmp_path / "A.jsonl", clean())
    (tmp_path / "out.md").symlink_to(timeline)
    assert (
        main(
            [
                "report",
                str(timeline),
                "-o",
                str(tmp_path / "B.md"),
                "--json",
                str(tmp_path / "out.md"),
            ]
        )
        == 0
    )
    assert timeline.read_bytes().startswith(b'{"leakgate_timeline"')


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
        (["report", "nolabel.jsonl"], "nolabel.jsonl:2: sample.label: expected a string, got null"),
        (["report", "rules.jsonl"], "rules.jsonl:1: header.meta.rules.max_growth: not a size"),
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


def test_errors_raised_below_the_commands_map_to_exit_2_and_one_line(tmp_path, monkeypatch, capsys):
    base = saved(tmp_path, "base", clean())

    def refused(*args, **kwargs):
        raise BadInput("expected a list of objects", path="base.json", field="findings")

    monkeypatch.setattr("harness._frontends.cli.compare_runs", refused)
    assert main(["compare", base, base]) == 2
    assert capsys.readouterr().err == "error: base.json: findings: expected a list of objects\n"

    def full(*args, **kwargs):
        raise UnwritableReport(tmp_path / "index.md", "No space left on device")

    monkeypatch.setattr("harness._frontends.gate.write_index", full)
    assert main(["index", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {tmp_path / 'index.md'}: cannot write (No space left on device)\n"


@pytest.mark.parametrize("value", ["ten", "-5%", "nan"])
def test_a_bad_tolerance_is_a_usage_error(tmp_path, value, capsys):
    assert main(["compare", "a.json", "b.json", "--tolerance", value]) == 2
    assert "--tolerance" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args",
    [
        ["compare", "a.json", "b.json", "--min-bytes", "1" * 300],
        ["compare", "a.json", "b.json", "--min-bytes", "1" * 400],
        ["gate", ".", "--min-bytes", "9" * 300 + "TiB"],
        ["report", "t.jsonl", "--max-growth", "1" * 300],
        ["report", "t.jsonl", "--max-peak", "1" * 400 + "MB"],
        ["report", "t.jsonl", "--warmup", "1" * 300],
    ],
)
def test_a_size_beyond_2_63_bytes_is_a_usage_error(args, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"error: argument {args[-2]}: " in err and "Traceback" not in err and len(err) < 1000


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


def test_report_runs_without_importing_torch(tmp_path):
    """Reading and judging a timeline needs no torch, whose import took the command's peak
    from 275 to 460 MiB on a million checkpoints (measured)."""
    timeline = write_timeline(tmp_path / "leaky.jsonl", incident())
    code = (
        "import sys; from harness._frontends.cli import main; "
        "code = main(['report', sys.argv[1]]); print(code, 'torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(timeline)], capture_output=True, text=True, check=False
    )
    assert done.stdout.split()[-2:] == ["1", "False"], done.stderr


@pytest.mark.parametrize("command", ["report", "gate", "merge"])
def test_commands_read_in_columns_without_importing_pandas(tmp_path, monkeypatch, command):
    """pyarrow imports pandas, where it is installed, to turn a column into numpy: 25 MiB of a
    million-checkpoint report's peak (measured). Here an installed pandas that says when it is
    imported; ``report`` reads a timeline, ``gate`` a folder of one and its verdict, ``merge``
    a rank's timeline. None imports torch either (``merge`` did, for holders none had named)."""
    if command == "merge":
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", "1")
    with (
        Recorder("cpu", timeline=tmp_path / "run.jsonl", children=False) as rec,
        rec.phase("validation", epoch=0),
    ):
        for batch in range(40):
            rec.checkpoint("VALIDATION_BATCH", batch=batch)
    timeline = rec.timeline_path
    monkeypatch.setattr(timeline_columns, "COLUMNS_FROM", 0)
    assert read_timeline(timeline).reader == "columns"
    if command == "gate":
        assert main(["report", str(timeline)]) == 0
    given = str(tmp_path if command == "gate" else timeline)
    imported = tmp_path / "pandas-imported"
    (tmp_path / "site" / "pandas").mkdir(parents=True)
    (tmp_path / "site" / "pandas" / "__init__.py").write_text(
        f"open({str(imported)!r}, 'w')\n__version__ = '2.2.0'\n"
    )
    code = (
        "import sys; import harness._timeline.columns as c; c.COLUMNS_FROM = 0; "
        "from harness._frontends.cli import main; print(main(sys.argv[1:]), 'torch' in sys.modules)"
    )
    path = os.pathsep.join([str(tmp_path / "site"), str(ROOT), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", code, command, given],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert done.stdout.split()[-2:] == ["0", "False"], done.stdout + done.stderr
    assert not imported.exists()


@pytest.mark.parametrize("command", ["report", "compare", "index", "gate"])
def test_every_command_has_help(command, capsys):
    assert main([command, "--help"]) == 0 and "usage: leakgate" in capsys.readouterr().out

"""The history refuses what it cannot use with one line and exit 2 (a usage error from pytest),
and never waits on a network without a bound: files that carry the history's key but not its
columns, a store that does not answer or is not one, a page written over the history, and runs
without a commit judged as what they are."""

import contextlib
import dataclasses
import http.server
import json
import os
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_history import MIB, built, creeping, one_line_exit_2, row, verdict

from harness._frontends.cli import main
from harness._history.archive import (
    MARKER,
    SCHEMA,
    HistoryPlace,
    append,
    history_summary,
    open_history,
)


def odd_file(folder: Path, column: str, values: pa.Array | None) -> Path:
    """A run file that carries the history's key, its ``column`` replaced by ``values`` (or
    gone, for None), named to sort before the runs."""
    table = pa.Table.from_pylist([dataclasses.asdict(row(0, MIB))], schema=SCHEMA)
    at = table.schema.get_field_index(column)
    table = table.remove_column(at)
    if values is not None:
        table = table.add_column(at, column, values)
    table = table.replace_schema_metadata(SCHEMA.metadata)
    path = folder / "20250101T000000000000-odd.parquet"
    pq.write_table(table, path)
    return path


ODD = {
    "no peak column": ("peak", None, "no peak column"),
    "a test of nulls": ("test", pa.nulls(1, pa.string()), "a row without a test"),
    "peak as text": ("peak", pa.array(["1048576"]), "its peak column is string"),
    "cores as text": ("cores", pa.array(["2"]), "its cores column is string"),
    "time as a number": ("time", pa.array([1], pa.int64()), "its time column is int64"),
    "commit as a number": ("commit", pa.array([7], pa.int64()), "its commit column is int64"),
}


@pytest.mark.parametrize("case", list(ODD))
def test_a_run_file_without_a_history_s_columns_is_refused_by_the_page_and_the_gate(
    case, tmp_path, capsys
):
    column, values, said = ODD[case]
    document = verdict(MIB)
    mine = HistoryPlace.here().rows([history_summary(document)], "test")[0]
    folder = built(tmp_path / "h", [MIB] * 3, test=mine.test, fingerprint=mine.fingerprint)
    odd = odd_file(folder, column, values)
    one_line_exit_2(capsys, ["history", str(folder)], f"{odd.name}: not a leakgate history file")
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "run.json").write_text(json.dumps(document))
    argv = ["gate", str(reports), "--history", str(folder), "--max-creep", "10%/20"]
    one_line_exit_2(capsys, argv, said)


def test_a_page_is_never_written_inside_a_history(tmp_path, capsys):
    folder = built(tmp_path / "h", [MIB] * 3)
    marker = (folder / MARKER).read_bytes()
    before = sorted(p.name for p in folder.iterdir())
    for inside in (folder / MARKER, folder / "page.md", folder / "sub" / "page.md"):
        argv = ["history", str(folder), "-o", str(inside)]
        one_line_exit_2(capsys, argv, "is inside the history")
    assert (folder / MARKER).read_bytes() == marker
    assert sorted(p.name for p in folder.iterdir()) == before
    assert main(["history", str(folder)]) == 0  # still a history


def test_pytest_never_writes_its_reports_inside_the_history(tmp_path, pytester):
    built(pytester.path / "hist", [MIB] * 3)
    pytester.makepyfile(test_ran=PASSING)
    for reports in ("hist", "hist/reports"):
        args = [f"--memreport={reports}", "--memreport-history=hist"]
        result = pytester.runpytest("-p", "no:randomly", *args)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        errors = [line for line in result.stderr.lines if line.strip()]
        assert len(errors) == 1 and "is inside the history" in errors[0], errors
        assert "--memreport" in errors[0] and not (pytester.path / "ran").exists()
    kept = [p.name for p in (pytester.path / "hist").iterdir() if p.suffix != ".parquet"]
    assert kept == [MARKER]


@pytest.fixture
def outside_git(tmp_path, monkeypatch):
    """The gate run where no repository is: its runs have no commit."""
    monkeypatch.chdir(tmp_path)
    assert HistoryPlace.here().commit is None


def commitless_history(tmp_path, peaks):
    """A history of ``peaks`` without a commit, for the example verdict's test on this
    machine, and a folder holding that verdict at the last peak."""
    document = verdict(peaks[-1])
    mine = HistoryPlace.here().rows([history_summary(document)], "test")[0]
    history = open_history(tmp_path / "history", mode="append")
    for i, peak in enumerate(peaks[:-1]):
        made = row(i, peak, test=mine.test, fingerprint=mine.fingerprint)
        append(history, [dataclasses.replace(made, commit=None, dirty=None)])
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "run.json").write_text(json.dumps(document))
    return ["gate", str(reports), "--history", str(tmp_path / "history"), "--max-creep"]


def test_runs_without_a_commit_are_judged_in_the_order_they_ran(tmp_path, capsys, outside_git):
    argv = commitless_history(tmp_path, creeping(21, start=6))
    assert main(argv) == 1
    out = capsys.readouterr().out
    crept = [line for line in out.splitlines() if line.startswith("creep:")]
    assert len(crept) == 1 and " peak " in crept[0], out
    assert "(20 runs without a commit;" in crept[0] and "over the last 20 runs" in crept[0]
    first = row(6, MIB).time  # the first run of the rise
    assert f"since the run of {first:%Y-%m-%d %H:%M:%S} UTC (no commit)" in crept[0]
    assert "not enough history" not in out
    assert main(["history", str(tmp_path / "history")]) == 0
    page = capsys.readouterr().out
    assert "21 runs without a commit; the last 21 shown" in page
    assert f'"{first:%m-%d %H:%M}"' in page and "(no commit)" in page  # the axis, the creep


def test_flat_runs_without_a_commit_pass_on_evidence(tmp_path, capsys, outside_git):
    rng = np.random.default_rng(3)
    argv = commitless_history(tmp_path, [100 * MIB * (1 + 0.02 * rng.normal()) for _ in range(21)])
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "creep:" not in out, out


def test_runs_on_too_few_commits_say_so(tmp_path, capsys):
    document = verdict(MIB)
    mine = HistoryPlace.here().rows([history_summary(document)], "test")[0]
    history = open_history(tmp_path / "history", mode="append")
    for i in range(20):
        append(history, [row(i, MIB, test=mine.test, fingerprint=mine.fingerprint, commit="c1")])
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "run.json").write_text(json.dumps(document))
    argv = ["gate", str(reports), "--history", str(tmp_path / "history"), "--max-creep"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "not enough history (20 comparable runs on 2 commits; a trend needs 3)" in out, out


@contextlib.contextmanager
def silent_endpoint():
    """A port that takes connections and never answers: a network that does not."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(64)
        yield f"127.0.0.1:{listening.getsockname()[1]}"


class NotFound(http.server.BaseHTTPRequestHandler):
    """What a proxy answers for a network it cannot reach: 404, and nothing else."""

    def answer(self) -> None:
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def not_a_store(monkeypatch):
    """An S3 endpoint (``AWS_ENDPOINT_URL``) where a proxy answers 404 to everything."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{server.server_address[1]}")
    for name, value in (("ACCESS_KEY_ID", "k"), ("SECRET_ACCESS_KEY", "s"), ("REGION", "x")):
        monkeypatch.setenv(f"AWS_{name}", value)
    yield
    server.shutdown()
    server.server_close()


PASSING = """
def test_ran():
    open("ran", "w").close()
"""


def test_an_endpoint_that_is_not_a_store_is_not_called_a_missing_bucket(
    not_a_store, tmp_path, capsys, pytester
):
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "run.json").write_text(json.dumps(verdict(MIB)))
    for argv in (["history", "s3://hist/lg"], ["gate", str(reports), "--history", "s3://hist/lg"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
        assert "answered 404 without saying what is missing" in err and "Bucket" not in err
    pytester.makepyfile(test_ran=PASSING)
    result = pytester.runpytest("-p", "no:randomly", "--memreport-history=s3://hist/lg")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.strip()]
    assert len(errors) == 1 and "answered 404" in errors[0], errors
    assert not (pytester.path / "ran").exists()


def test_gcs_without_an_answer_is_given_up_after_the_wait(monkeypatch, tmp_path, capsys, pytester):
    monkeypatch.setenv("LEAKGATE_HISTORY_TIMEOUT", "1")
    with silent_endpoint() as endpoint:
        uri = f"gs://anonymous@bucket/h?endpoint_override={endpoint}&scheme=http"
        one_line_exit_2(capsys, ["history", uri], "no answer within 1 s")
        reports = tmp_path / "reports"
        reports.mkdir()
        (reports / "run.json").write_text(json.dumps(verdict(MIB)))
        one_line_exit_2(capsys, ["gate", str(reports), "--history", uri], "no answer within 1 s")
        pytester.makepyfile(test_ran=PASSING)
        result = pytester.runpytest("-p", "no:randomly", f"--memreport-history={uri}")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        errors = [line for line in result.stderr.lines if line.strip()]
        assert len(errors) == 1 and "no answer within 1 s" in errors[0], errors
        assert not (pytester.path / "ran").exists()


def test_a_credential_helper_s_words_never_precede_the_one_line(tmp_path):
    helpers = tmp_path / "bin"
    helpers.mkdir()
    az = helpers / "az"  # what the Azure client runs for a token: here it complains and fails
    az.write_text("#!/bin/sh\necho 'az: the helper complains' >&2\nexit 1\n")
    az.chmod(az.stat().st_mode | stat.S_IXUSR)
    env = {
        **os.environ,
        "PATH": f"{helpers}{os.pathsep}{os.environ['PATH']}",
        "LEAKGATE_HISTORY_TIMEOUT": "20",
    }
    done = subprocess.run(
        [sys.executable, "-m", "harness", "history", "abfs://box@account.dfs.core.windows.net/h"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot open the history" in lines[0], done.stderr
    assert "az:" not in done.stderr


def test_a_bad_wait_is_refused(monkeypatch, capsys):
    monkeypatch.setenv("LEAKGATE_HISTORY_TIMEOUT", "soon")
    one_line_exit_2(capsys, ["history", "s3://bucket/h"], "LEAKGATE_HISTORY_TIMEOUT")

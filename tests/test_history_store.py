"""The history store on a local folder and on a real S3 server (moto's, in a thread of this
process, on a free port), reached as a team reaches theirs: pyarrow's S3 client configured by
the environment (``AWS_ENDPOINT_URL``, the credentials), every request signed and checked.

Four writers at once, a writer killed mid-write, 2,000 runs (more than one page of a listing),
the page, the creep gate and pytest reading the same history from either place with the same
result; on S3, a bucket that does not exist, wrong credentials, and endpoints that refuse or
never answer, each one line and a bounded wait."""

import dataclasses
import json
import re
import socket
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from test_history import (
    KILLED,
    MIB,
    PASSING,
    WRITER,
    creeping,
    one_line_exit_2,
    row,
    verdict,
)
from test_history_reliability import silent_endpoint

from harness._frontends.cli import main
from harness._history.archive import (
    MARKER,
    HistoryPlace,
    append,
    history_summary,
    open_history,
    scan,
)
from harness._history.series import Selection, read_series

ROOT = Path(__file__).resolve().parent.parent
BUCKET = "leakgate"
NO_MOTO = "moto[server] is not installed: the S3 server tests need it (pip install 'moto[server]')"


@dataclasses.dataclass(frozen=True)
class S3Server:
    """A running S3 server: its endpoint and the access key of a user allowed the bucket."""

    endpoint: str
    key: str
    secret: str
    readers: tuple[str, str]  # the key of a user who may read the bucket, never write

    def environment(self, monkeypatch, *, key=None, secret=None, endpoint=None) -> None:
        """The environment a team's CI sets for pyarrow's S3 client."""
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint or self.endpoint)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key or self.key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret or self.secret)
        monkeypatch.setenv("AWS_REGION", "us-east-1")
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on a free port, with a bucket and a user whose key may use it; from
    its start on, every request must be signed by a key the server made."""
    server_module = pytest.importorskip("moto.server", reason=NO_MOTO)
    import boto3
    import requests

    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    admin = {
        "endpoint_url": endpoint,
        "region_name": "us-east-1",
        "aws_access_key_id": "admin",
        "aws_secret_access_key": "admin",
    }
    iam = boto3.client("iam", **admin)
    allowed = {"Effect": "Allow", "Action": "s3:*", "Resource": "*"}
    no_writes = {"Effect": "Deny", "Action": "s3:PutObject", "Resource": "*"}
    keys = []
    for user, statements in (("ci", [allowed]), ("reader", [allowed, no_writes])):
        iam.create_user(UserName=user)
        policy = json.dumps({"Version": "2012-10-17", "Statement": statements})
        iam.put_user_policy(UserName=user, PolicyName="history", PolicyDocument=policy)
        made = iam.create_access_key(UserName=user)["AccessKey"]
        keys.append((made["AccessKeyId"], made["SecretAccessKey"]))
    boto3.client("s3", **admin).create_bucket(Bucket=BUCKET)
    requests.post(f"{endpoint}/moto-api/reset-auth", data=b"0", timeout=30)
    yield S3Server(endpoint, *keys[0], readers=keys[1])
    requests.post(f"{endpoint}/moto-api/reset-auth", data=b"inf", timeout=30)
    server.stop()


@pytest.fixture(params=["folder", "s3"])
def store(request, tmp_path, monkeypatch) -> str:
    """Where a new history goes: a local folder, or a prefix of its own in the S3 bucket."""
    if request.param == "folder":
        return str(tmp_path / "history")
    request.getfixturevalue("s3_server").environment(monkeypatch)
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}/history"


@pytest.fixture
def s3(s3_server, monkeypatch) -> S3Server:
    """The S3 server, this test's environment pointing at it."""
    s3_server.environment(monkeypatch)
    return s3_server


def runs_of(where: str) -> list[str]:
    history = open_history(where)
    return [r for b in scan(history, ("run",)) for r in b.column("run").to_pylist()]


def names_in(where: str) -> list[str]:
    """Every name under the history's folder, hidden ones too."""
    history = open_history(where)
    found = history.fs.get_file_info(pafs.FileSelector(history.path, recursive=True))
    return sorted(info.base_name for info in found)


def built_in(where: str, peaks, **kwargs) -> str:
    history = open_history(where, mode="append")
    for i, peak in enumerate(peaks):
        append(history, [row(i, peak, **kwargs)])
    return where


def test_four_processes_append_at_once_and_lose_no_row(store):
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, store, f"w{n}", "5"]) for n in range(4)
    ]
    assert [w.wait() for w in writers] == [0] * 4
    runs = runs_of(store)
    assert len(runs) == 4 * 5 * 10 and len(set(runs)) == 20
    assert len(open_history(store).files()) == 20


ON_A_STORE = """
import os, signal
import harness._history.archive as archive

class Cut:
    '''A run's upload that half its bytes reach before its writer is killed.'''

    def __init__(self, stream):
        self.stream = stream

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stream.close()

    def write(self, data):
        self.stream.write(data[: len(data) // 2])
        self.stream.flush()
        os.kill(os.getpid(), signal.SIGKILL)

class Killing:
    def __init__(self, fs):
        self.fs = fs

    def __getattr__(self, name):
        return getattr(self.fs, name)

    def open_output_stream(self, path, *args, **kwargs):
        stream = self.fs.open_output_stream(path, *args, **kwargs)
        return Cut(stream) if path.endswith(".parquet") else stream

opened = archive.open_uri
archive.open_uri = lambda uri: (lambda fs, path: (Killing(fs), path))(*opened(uri))
"""


def test_a_writer_killed_mid_write_leaves_nothing_that_is_read(store, capsys):
    built_in(store, [100 * MIB] * 3)
    killer = ON_A_STORE + WRITER if store.startswith("s3://") else KILLED
    done = subprocess.run([sys.executable, "-c", killer, store, "killed", "1"], check=False)
    assert done.returncode == -9
    assert len(open_history(store).files()) == 3 and len(runs_of(store)) == 3
    left = [n for n in names_in(store) if n != MARKER and not n.endswith(".parquet")]
    if store.startswith("s3://"):
        assert left == []  # an object appears when its upload completes, never before
    else:
        assert len(left) == 1 and left[0].startswith(".") and left[0].endswith(".tmp")
    assert main(["history", store]) == 0
    assert "1 test on 1 machine fingerprint" in capsys.readouterr().out


@pytest.mark.slow
def test_2000_runs_are_all_listed_and_the_gate_reads_only_its_window(store):
    history = open_history(store, mode="append")
    with ThreadPoolExecutor(8) as pool:  # more runs than a listing's page (1,000 on S3)
        list(pool.map(lambda i: append(history, [row(i, float(i))]), range(2000)))
    files = history.files()
    assert len(files) == 2000 and files == sorted(files)
    assert Path(files[0]).name.startswith("000000-") and Path(files[-1]).name.startswith("001999-")
    chosen = Selection(metric="allocated", fingerprint="fp-a", tests=frozenset({"t.py::test_x"}))
    (found,) = read_series(history, chosen, window=20)
    assert found.commits == [f"c{i:03d}" for i in range(1980, 2000)]


def gate_output(tmp_path: Path, where: str, peaks: list[float], capsys) -> tuple[int, list[str]]:
    """The creep gate over a history of ``peaks`` at ``where`` (then the last peak, gated):
    its exit code and its lines, the history's place written as HISTORY."""
    document = verdict(peaks[-1])
    mine = HistoryPlace.here().rows([history_summary(document)], "test")[0]
    built_in(where, peaks[:-1], test=mine.test, fingerprint=mine.fingerprint)
    reports = tmp_path / uuid.uuid4().hex
    reports.mkdir()
    (reports / "run.json").write_text(json.dumps(document))
    code = main(["gate", str(reports), "--history", where, "--max-creep"])
    out = capsys.readouterr().out.replace(where, "HISTORY").replace(str(reports), "REPORTS")
    return code, out.splitlines()


def test_s3_and_a_folder_give_the_same_page_and_the_same_gate(s3, tmp_path, capsys):
    peaks = creeping(21, start=6)
    folder, bucket = str(tmp_path / "history"), f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}/h"
    gated = [gate_output(tmp_path, where, peaks, capsys) for where in (folder, bucket)]
    assert gated[0] == gated[1] and gated[0][0] == 1
    assert any("since c006" in line for line in gated[0][1]), gated[0]
    pages = []
    for where in (folder, bucket):
        assert main(["history", where]) == 0
        pages.append(capsys.readouterr().out)
    assert pages[0] == pages[1] and "since `c006`" in pages[0]


def test_pytest_appends_to_the_store(store, pytester):
    pytester.makepyfile(test_loop=PASSING)
    for _ in range(2):
        result = pytester.runpytest("-p", "no:randomly", f"--memreport-history={store}")
        assert f"leakgate history: appended 1 test to {store}" in result.stdout.str()
    assert len(runs_of(store)) == 2


def docs_query() -> str:
    """The query of ``docs/history.md``: the fenced block after its ``<!-- query -->``."""
    text = (ROOT / "docs" / "history.md").read_text()
    return re.search(r"<!-- query -->\s*```python\n(.*?)\n```", text, re.S)[1]


def test_the_documented_query_reads_the_history_with_pyarrow_dataset(store, capsys):
    built_in(store, [100 * MIB, 120 * MIB, 90 * MIB], test="tests/test_a.py::test_a")
    built_in(store, [10 * MIB, 30 * MIB], test="tests/test_b.py::test_b")
    history = open_history(store)
    assert len(history.files()) == 5
    found: dict = {"HISTORY": store}
    exec(compile(docs_query(), "docs/history.md", "exec"), found)
    worst = found["worst"].to_pylist()
    assert worst == [
        {"test": "tests/test_a.py::test_a", "peak_max": 120 * MIB, "peak_count": 3},
        {"test": "tests/test_b.py::test_b", "peak_max": 30 * MIB, "peak_count": 2},
    ]


def test_a_bucket_that_does_not_exist_is_named(s3, tmp_path, capsys, pytester):
    where = "s3://no-such-bucket/history"
    one_line_exit_2(capsys, ["history", where], "the bucket does not exist")
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "run.json").write_text(json.dumps(verdict(MIB)))
    one_line_exit_2(capsys, ["gate", str(reports), "--history", where], "the bucket does not exist")
    pytester.makepyfile(test_ran="def test_ran():\n    open('ran', 'w').close()\n")
    result = pytester.runpytest("-p", "no:randomly", f"--memreport-history={where}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.strip()]
    assert len(errors) == 1 and "the bucket does not exist" in errors[0], errors
    assert not (pytester.path / "ran").exists()


@pytest.mark.parametrize(
    ("key", "secret", "said"),
    [
        (None, "not-the-secret", "a wrong secret key"),
        ("AKIAUNKNOWNKEY000000", "x", "an access key the store never made"),
    ],
)
def test_wrong_credentials_are_said_and_change_nothing(
    s3, key, secret, said, tmp_path, monkeypatch, capsys
):
    where = built_in(f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}/h", [MIB] * 3)
    before = names_in(where)
    s3.environment(monkeypatch, key=key, secret=secret)
    one_line_exit_2(capsys, ["history", where], said)
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "run.json").write_text(json.dumps(verdict(MIB)))
    one_line_exit_2(capsys, ["gate", str(reports), "--history", where, "--max-creep"], said)
    s3.environment(monkeypatch)
    assert names_in(where) == before


def test_a_key_that_may_not_write_keeps_the_verdicts_and_says_why(
    s3, tmp_path, monkeypatch, capsys, pytester
):
    where = built_in(f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}/h", [MIB] * 3)
    before = names_in(where)
    s3.environment(monkeypatch, key=s3.readers[0], secret=s3.readers[1])
    assert main(["history", where]) == 0  # reading is allowed
    capsys.readouterr()
    pytester.makepyfile(test_loop=PASSING)
    result = pytester.runpytest("-p", "no:randomly", f"--memreport-history={where}")
    assert result.ret != pytest.ExitCode.USAGE_ERROR  # the session ran: its verdicts stand
    assert "test_loop.py::test_kept" in result.stdout.str()
    warned = [line for line in result.stdout.lines if "history not appended" in line]
    assert len(warned) == 1 and "access denied" in warned[0], result.stdout.str()
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "run.json").write_text(json.dumps(verdict(MIB)))
    one_line_exit_2(capsys, ["gate", str(reports), "--history", where], "access denied")
    assert "Gate: REFUSED" in (reports / "index.md").read_text()  # no earlier decision shown
    s3.environment(monkeypatch)
    assert names_in(where) == before


def test_an_endpoint_that_never_answers_is_given_up_after_the_wait(monkeypatch, capsys):
    monkeypatch.setenv("LEAKGATE_HISTORY_TIMEOUT", "1")
    with silent_endpoint() as endpoint:
        S3Server(f"http://{endpoint}", "k", "s", ("k", "s")).environment(monkeypatch)
        one_line_exit_2(capsys, ["history", "s3://bucket/h"], "no answer within 1 s")


def test_an_endpoint_where_nothing_listens_is_said(monkeypatch, capsys):
    monkeypatch.setenv("LEAKGATE_HISTORY_TIMEOUT", "1")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"
    S3Server(endpoint, "k", "s", ("k", "s")).environment(monkeypatch)
    one_line_exit_2(capsys, ["history", "s3://bucket/h"], "nothing answers at the endpoint")

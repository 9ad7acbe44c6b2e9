"""Reading a memory history from an S3 server: the creep gate's reading at 1,000 and 10,000 runs
of 1,000 tests each.

The histories of ``bench_history.py`` are written to a folder, then copied into a bucket of
moto's S3 server (started here, on a free port, so that the server's work is not the child's).
The creep gate's reading (``bench_history.STEPS["creep"]``: the last 20 runs of each of the
1,000 tests, newest first, after listing every run) then runs in a child process that reaches
the server as a CI job reaches S3, through ``AWS_ENDPOINT_URL`` and the credentials in the
environment; its wall time and peak resident memory are kept, of the fastest of
:data:`ROUNDS` children. The same reading from the folder runs beside it.

    pytest benchmarks/bench_history_s3.py
"""

from __future__ import annotations

import os
import uuid

import pyarrow.fs as pafs
import pytest
from bench_history import SIZES, STEPS, TESTS, _measured, write_history

BUCKET = "leakgate-bench"
ROUNDS = 3
"""Children run for each reading; the fastest is kept."""


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory):
    """moto's S3 server with one bucket, the environment pointing at it; skipped without moto."""
    server_module = pytest.importorskip("moto.server", reason="needs moto[server]")
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    saved = dict(os.environ)
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
    )
    fs = pafs.S3FileSystem(endpoint_override=endpoint, allow_bucket_creation=True)
    fs.create_dir(BUCKET)
    yield fs
    os.environ.clear()
    os.environ.update(saved)
    server.stop()


@pytest.fixture(scope="module")
def histories(s3, tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[str, str]]:
    """Each size of :data:`SIZES`: its folder, and its copy's URI in the bucket."""
    made = {}
    for runs in SIZES:
        folder = tmp_path_factory.mktemp("history") / f"h{runs}"
        write_history(folder, runs)
        prefix = f"{BUCKET}/{uuid.uuid4().hex[:8]}/h{runs}"
        pafs.copy_files(
            str(folder), prefix, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=s3
        )
        made[runs] = (str(folder), f"s3://{prefix}")
    return made


@pytest.mark.parametrize(("runs", "place"), [(r, p) for r in SIZES for p in ("folder", "s3")])
def test_creep_gate_reading(benchmark, histories, runs, place, tmp_path):
    folder, uri = histories[runs]
    where = folder if place == "folder" else uri
    tries = benchmark.pedantic(
        lambda: [_measured(STEPS["creep"], where, tmp_path) for _ in range(ROUNDS)], rounds=1
    )
    result = min(tries, key=lambda r: r["seconds"])  # the least disturbed by other work
    seconds = [round(r["seconds"], 2) for r in tries]
    benchmark.extra_info.update(result, runs=runs, tests=TESTS, place=place, tries=seconds)
    assert result["exit"] == 0, result
    assert result["last"] == f"{TESTS // 100} crept 0 notes", result

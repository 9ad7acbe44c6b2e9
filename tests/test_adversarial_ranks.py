"""Bad input on the distributed surface and odd files among the inputs: ``leakgate merge`` (and
``python -m harness._frontends.distributed``) never writes over an input or outside its folder and
checks rank and world size; the gate needs a rank timeline's merged verdict even beside the rank's
own; FIFOs, sockets and device files among the inputs are refused at once instead of hanging.

Every command that could hang runs in a subprocess with a timeout: a hang fails its test.
"""

import contextlib
import io
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness._core import fsio
from harness._core.identity import MAX_WORLD_SIZE, check_rank, check_world_size, rank_info
from harness._core.naming import check_file_name, safe_name
from harness._frontends import distributed
from harness._frontends.cli import main
from harness._measure.sample import Sample
from harness._results.merge import merge_timelines
from harness._timeline.jsonl import TimelineWriter, read_timeline

ROOT = Path(__file__).resolve().parents[1]
KB = 2**10
RULES = {"phase": "validation", "max_growth": "40KiB", "warmup": 5, "max_peak": "8MiB"}
PROMPT = 30
"""Seconds a command that must not hang gets; a hung one is killed and its test fails."""
MEMORY = 4 << 30
"""Address space a command in a subprocess gets: one that would exhaust memory fails alone."""


def rank_timeline(
    path: Path, rank: int, world: int, per_batch: int = 0, header: dict | None = None
) -> Path:
    """A finished rank timeline: a 30-batch validation loop growing by ``per_batch`` a batch,
    its header updated by ``header``."""
    fields = {
        "run_id": f"{path.stem.replace('.', '-')}-{rank}",
        "rank": rank,
        "world_size": world,
        "backend": "gloo",
        "primary": "allocated",
        "meta": {"rules": RULES},
        **(header or {}),
    }
    writer = TimelineWriter(path, fields)
    noise = [0, 96, -64, 32, -128, 64]
    base = 100 * 2**20
    samples = [Sample("SESSION_START", "session", None, None, 0.0, {"allocated": base})]
    samples += [
        Sample(
            "BATCH",
            "validation",
            0,
            b,
            float(b),
            {"allocated": base + b * per_batch + noise[b % 6]},
        )
        for b in range(30)
    ]
    samples.append(Sample("SESSION_END", "session", None, None, 31.0, {"allocated": base}))
    for sample in samples:
        writer.write(sample)
    writer.end(None)
    writer.close()
    return path


def two_ranks(folder: Path, name: str = "run", per_batch: tuple[int, int] = (0, 0)) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return [
        rank_timeline(folder / f"{name}.rank{r}.jsonl", r, 2, grow)
        for r, grow in enumerate(per_batch)
    ]


def run_main(argv, entry=main):
    """``entry(argv)`` (``leakgate``'s main unless told) with its output captured: (exit code,
    stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = entry(argv)
    return code, out.getvalue(), err.getvalue()


def merge_command(data, args):
    """``leakgate merge ARGS`` or ``python -m harness._frontends.distributed ARGS``, drawn: the argv
    and the entry point that takes it."""
    if data.draw(st.booleans()):
        return list(args), distributed.merge_main
    return ["merge", *args], main


def leakgate(*args: str, module: str = "harness") -> subprocess.CompletedProcess[str]:
    """The command in a subprocess that must end within :data:`PROMPT` seconds."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        return subprocess.run(
            [sys.executable, "-m", module, *args],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=PROMPT,
            check=False,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY)),
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"leakgate {' '.join(args)} did not return within {PROMPT} s")


def one_line(err: str) -> bool:
    return err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every regular file under ``folder`` and its bytes."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


# -- case 4: merge never writes over an input or outside its folder ----------------------------


@pytest.mark.parametrize("suffix", [".json", ".md"])
def test_merge_refuses_to_replace_its_input(tmp_path, suffix):
    solo = rank_timeline(tmp_path / f"solo{suffix}", 0, 1)
    before = solo.read_bytes()
    code, _, err = run_main(["merge", str(solo)])
    assert code == 2 and one_line(err), err
    assert "would replace the input" in err
    assert solo.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [solo.name]


def test_merge_refuses_an_output_that_is_its_input_through_links(tmp_path):
    solo = rank_timeline(tmp_path / "d" / "solo.json", 0, 1)
    (tmp_path / "linked").symlink_to(tmp_path / "d")
    before = snapshot(tmp_path)
    code, _, err = run_main(["merge", str(tmp_path / "linked" / "solo.json")])
    assert code == 2 and one_line(err) and "would replace the input" in err, err
    assert snapshot(tmp_path) == before
    paths = two_ranks(tmp_path / "r")
    os.link(paths[0], tmp_path / "out.json")
    before = snapshot(tmp_path)
    code, _, err = run_main(
        ["merge", *map(str, paths), "--name", "out", "--directory", str(tmp_path)]
    )
    assert code == 2 and one_line(err) and "would replace the input" in err, err
    assert snapshot(tmp_path) == before and solo.exists()


@pytest.mark.parametrize(
    "name", ["../../outside/escaped", "", "..", ".", "a/b", ".hidden", "x\ny", "a\x00b", "x" * 201]
)
def test_merge_refuses_a_name_that_is_not_a_plain_file_name(tmp_path, name):
    inside = tmp_path / "a" / "b" / "d"
    paths = two_ranks(inside)
    before = snapshot(tmp_path)
    code, _, err = run_main(["merge", *map(str, paths), "--name", name])
    assert code == 2 and one_line(err), err
    assert "--name" in err
    assert snapshot(tmp_path) == before
    assert not (tmp_path / "a" / "outside").exists()


def test_merge_takes_a_plain_name_and_safe_names_are_plain(tmp_path):
    paths = two_ranks(tmp_path)
    code, _, _ = run_main(["merge", *map(str, paths), "--name", "two ranks-v1.2"])
    assert code == 0 and json.loads((tmp_path / "two ranks-v1.2.json").read_text())["status"]
    for nodeid in ("tests/t.py::test[../..]", "..", "", "a" * 500):
        assert check_file_name(safe_name(nodeid)) == safe_name(nodeid)


def test_merge_timelines_refuses_a_bad_name_at_the_call(tmp_path):
    paths = two_ranks(tmp_path)
    with pytest.raises(ValueError, match="not a plain file name"):
        merge_timelines(paths, name="../up")
    with pytest.raises(TypeError, match="name"):
        merge_timelines(paths, name=3)  # type: ignore[arg-type]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.rank0.jsonl", "run.rank1.jsonl"]


def test_run_ranks_refuses_a_bad_name_or_world_size_before_it_starts(tmp_path):
    from harness._frontends.spawn import run_ranks

    with pytest.raises(ValueError, match="not a plain file name"):
        run_ranks(print, 2, name="../up", directory=tmp_path)
    for nproc in (0, MAX_WORLD_SIZE + 1):
        with pytest.raises(ValueError, match="world size"):
            run_ranks(print, nproc, name="ok", directory=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_python_m_harness_distributed_refuses_a_name_outside(tmp_path):
    paths = two_ranks(tmp_path / "a" / "d")
    done = leakgate(
        *map(str, paths), "--name", "../../escaped", module="harness._frontends.distributed"
    )
    assert done.returncode == 2 and one_line(done.stderr), done.stderr
    assert not (tmp_path / "escaped.json").exists() and not (tmp_path / "escaped.md").exists()


# -- case 5: rank and world size are checked once, everywhere ----------------------------------


@pytest.mark.parametrize("world", ["-1", "0", "1", "3", str(MAX_WORLD_SIZE + 1)])
def test_merge_refuses_a_world_size_that_does_not_fit_the_ranks(tmp_path, world):
    paths = two_ranks(tmp_path)
    before = snapshot(tmp_path)
    code, _, err = run_main(["merge", *map(str, paths), "--world-size", world])
    assert code == 2 and one_line(err) and "world size" in err, err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "fields",
    [
        {"world_size": 0},
        {"world_size": -3},
        {"world_size": 1},
        {"world_size": True},
        {"world_size": "2"},
        {"rank": -1},
        {"world_size": MAX_WORLD_SIZE + 1},
    ],
)
def test_merge_refuses_a_header_with_an_impossible_rank_or_world_size(tmp_path, fields):
    good = rank_timeline(tmp_path / "run.rank0.jsonl", 0, 2)
    bad = rank_timeline(tmp_path / "run.rank1.jsonl", 1, 2, header=fields)
    code, _, err = run_main(["merge", str(good), str(bad)])
    assert code == 2 and one_line(err), err
    assert "run.rank1.jsonl" in err and ("rank" in err or "world size" in err)
    assert not (tmp_path / "run.json").exists()


def test_ranks_that_disagree_on_the_world_size_are_bad_input(tmp_path):
    first = rank_timeline(tmp_path / "run.rank0.jsonl", 0, 2)
    second = rank_timeline(tmp_path / "run.rank1.jsonl", 1, 4)
    code, _, err = run_main(["merge", str(first), str(second)])
    assert code == 2 and one_line(err) and "world size" in err, err
    code, _, err = run_main(["merge", str(first), "--world-size", "3"])
    assert code == 2 and one_line(err) and "world size" in err, err


@pytest.mark.parametrize(
    "option, fields",
    [
        (["--world-size", str(10**9)], {}),
        ([], {"world_size": 10**18}),
        ([], {"rank": 10**18}),
        ([], {"rank": 10**18, "world_size": 10**18 + 1}),
    ],
)
def test_a_huge_world_size_or_rank_is_refused_at_once(tmp_path, option, fields):
    """Listing 10**9 ranks ran out of memory after ~10 s: in a subprocess held to
    :data:`MEMORY`, a refusal is one line."""
    good = rank_timeline(tmp_path / "run.rank0.jsonl", 0, 2)
    bad = rank_timeline(tmp_path / "run.rank1.jsonl", 1, 2, header=fields)
    done = leakgate("merge", str(good), str(bad), *option)
    assert done.returncode == 2 and one_line(done.stderr), done.stderr
    assert "world size" in done.stderr or "rank" in done.stderr


def test_a_killed_rank_in_a_large_world_is_named_in_one_short_line(tmp_path):
    paths = [rank_timeline(tmp_path / f"run.rank{r}.jsonl", r, MAX_WORLD_SIZE) for r in (0, 1)]
    finished = merge_timelines(paths)
    assert finished.verdict.status == "ERROR"
    assert (
        finished.verdict.error
        == f"rank 2-{MAX_WORLD_SIZE - 1} of {MAX_WORLD_SIZE} left no timeline"
    )


def test_the_rank_checks_are_one_set_shared_with_the_launcher_variables():
    assert check_world_size(2) == 2 and check_rank(1, 2) == 1
    for bad in (0, -1, MAX_WORLD_SIZE + 1, True, 2.0, "2"):
        with pytest.raises((ValueError, TypeError), match="world size"):
            check_world_size(bad)
    with pytest.raises(ValueError, match="rank 2 is not in a world of size 2"):
        check_rank(2, 2)
    with pytest.raises(ValueError, match="world size"):
        rank_info({"RANK": "0", "WORLD_SIZE": str(10**18)})


# -- case 8: a rank's own verdict does not stand in for the merged one -------------------------


def test_gate_fails_rank_timelines_whose_merged_verdict_is_missing(tmp_path):
    paths = two_ranks(tmp_path, per_batch=(2 * KB, 0))
    code, out, _ = run_main(["merge", *map(str, paths)])
    assert code == 1 and "rank 0 of 2 stands out" in out
    (tmp_path / "run.json").unlink()
    (tmp_path / "run.md").unlink()
    for path in paths:  # each rank's own verdict, rebuilt from its timeline
        code, _, _ = run_main(["report", str(path)])
        assert (tmp_path / f"{path.stem}.json").exists()
    code, out, _ = run_main(["gate", str(tmp_path)])
    assert code == 1, out
    assert "missing verdict: run.rank1.jsonl (rank 1) has no merged run.json" in out
    assert out.rstrip().splitlines()[-1].startswith("gate: FAIL")


def test_gate_passes_a_merged_run_beside_the_ranks_own_verdicts(tmp_path):
    paths = two_ranks(tmp_path)
    assert run_main(["merge", *map(str, paths)])[0] == 0
    for path in paths:
        assert run_main(["report", str(path)])[0] == 0
    code, out, _ = run_main(["gate", str(tmp_path)])
    assert code == 0, out
    # A rank's own verdict from another run is stale, merged verdict or not.
    rank_timeline(tmp_path / "later" / "run.rank1.jsonl", 1, 2, header={"run_id": "later-1"})
    os.replace(tmp_path / "later" / "run.rank1.jsonl", tmp_path / "run.rank1.jsonl")
    code, out, _ = run_main(["gate", str(tmp_path)])
    assert code == 1 and "stale verdict: run.rank1.json is from run run-rank1-1" in out, out


# -- case 7: FIFOs, sockets and device files among the inputs ----------------------------------


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


@contextlib.contextmanager
def unix_socket(path: Path):
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        yield path


@pytest.fixture
def short_tmp():
    """A folder with a short path: a unix socket's path is limited to about 100 bytes."""
    with tempfile.TemporaryDirectory(prefix="lg") as folder:
        yield Path(folder)


ODD = ["fifo", "socket", "device"]


@contextlib.contextmanager
def odd_file(kind: str, path: Path, device: str = "/dev/zero"):
    """``path`` made a FIFO, a bound unix socket or a link to ``device``."""
    if kind == "fifo":
        yield fifo(path)
    elif kind == "socket":
        with unix_socket(path):
            yield path
    else:
        path.symlink_to(device)
        yield path


@pytest.mark.parametrize("kind", ODD)
@pytest.mark.parametrize("name", ["x.jsonl", "x.json"])
def test_gate_on_a_folder_holding_an_odd_file_returns_at_once(short_tmp, kind, name):
    rank_timeline(short_tmp / "ok.jsonl", 0, 1)
    assert run_main(["report", str(short_tmp / "ok.jsonl")])[0] == 0
    with odd_file(kind, short_tmp / name):
        done = leakgate("gate", str(short_tmp))
    assert done.returncode == 2 and one_line(done.stderr), done.stderr
    assert name in done.stderr and "not a regular file" in done.stderr


@pytest.mark.parametrize("kind", ["fifo", "device"])
@pytest.mark.parametrize("command", ["report", "merge", "compare", "index"])
def test_every_command_refuses_an_odd_input_at_once(short_tmp, kind, command):
    good = rank_timeline(short_tmp / "good.rank0.jsonl", 0, 1)
    assert run_main(["report", str(good)])[0] == 0
    verdict = short_tmp / "good.rank0.json"
    odd_name = "odd.json" if command in ("compare", "index") else "good.rank1.jsonl"
    with odd_file(kind, short_tmp / odd_name) as odd:
        args = {
            "report": [str(odd)],
            "merge": [str(good), str(odd)],
            "compare": [str(verdict), str(odd)],
            "index": [str(short_tmp)],
        }[command]
        done = leakgate(command, *args)
    if command == "index":  # the index counts what it cannot read and goes on
        assert done.returncode == 0, done.stderr
        assert "1 JSON file here is not a leakgate verdict" in (short_tmp / "index.md").read_text()
        return
    assert done.returncode == 2 and one_line(done.stderr), done.stderr
    assert "not a regular file" in done.stderr


@pytest.mark.parametrize("kind", ODD)
def test_python_m_harness_distributed_refuses_an_odd_input_at_once(short_tmp, kind):
    good = rank_timeline(short_tmp / "run.rank0.jsonl", 0, 2)
    with odd_file(kind, short_tmp / "run.rank1.jsonl") as odd:
        done = leakgate(str(good), str(odd), module="harness._frontends.distributed")
    assert done.returncode == 2 and one_line(done.stderr), done.stderr
    assert "run.rank1.jsonl" in done.stderr and "not a regular file" in done.stderr
    assert sorted(p.name for p in short_tmp.iterdir()) == ["run.rank0.jsonl", "run.rank1.jsonl"]


def test_read_regular_refuses_before_it_blocks(short_tmp):
    with pytest.raises(OSError, match="a FIFO, not a regular file"):
        fsio.read_regular(fifo(short_tmp / "f"))
    with unix_socket(short_tmp / "s"), pytest.raises(OSError, match="a socket"):
        fsio.read_regular(short_tmp / "s")
    with pytest.raises(OSError, match="a character device"):
        fsio.read_regular("/dev/zero")
    with pytest.raises(IsADirectoryError):
        fsio.read_regular(short_tmp)
    (short_tmp / "plain").write_bytes(b"bytes")
    (short_tmp / "link").symlink_to(short_tmp / "plain")
    assert fsio.read_regular(short_tmp / "link") == b"bytes"


def test_read_timeline_opens_the_file_once(tmp_path, monkeypatch):
    path = rank_timeline(tmp_path / "t.jsonl", 0, 1)
    opened = []
    real = os.open

    def counting(file, *args, **kwargs):
        if str(file) == str(path):
            opened.append(file)
        return real(file, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting)
    assert len(read_timeline(path).samples) == 32
    assert len(opened) == 1


# -- fuzz: merge over mutated rank timelines and options ---------------------------------------

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
_LINES: dict[str, list[dict]] = {}


def rank_lines() -> dict[str, list[dict]]:
    """Rank 0 and 1 of a clean run, as parsed lines, made once."""
    if not _LINES:
        with tempfile.TemporaryDirectory() as folder:
            for path in two_ranks(Path(folder)):
                _LINES[path.name] = [json.loads(x) for x in path.read_text().splitlines()]
    return _LINES


whole = st.one_of(
    st.integers(-3, 2 * MAX_WORLD_SIZE),
    st.sampled_from([0, 1, 2, 3, -1, MAX_WORLD_SIZE, MAX_WORLD_SIZE + 1]),
)
"""Ranks and world sizes; huge ones are tried in a subprocess held to :data:`MEMORY` above."""
numbers = st.one_of(whole, st.floats(allow_nan=True))
values = st.one_of(numbers, st.none(), st.booleans(), st.text(max_size=8), st.lists(numbers))


@given(st.data())
@FUZZ
def test_fuzz_merge(data):
    lines = rank_lines()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        inside = root / "a" / "d"
        inside.mkdir(parents=True)
        for name, records in lines.items():
            header = dict(records[0])
            for _ in range(data.draw(st.integers(0, 2))):
                key = data.draw(
                    st.sampled_from(["rank", "world_size", "run_id", "meta", "backend"])
                )
                header[key] = data.draw(values)
            text = "\n".join(json.dumps(r) for r in [header, *records[1:]]) + "\n"
            (inside / name).write_text(text)
        options = []
        if data.draw(st.booleans()):
            options += ["--world-size", str(data.draw(whole))]
        if data.draw(st.booleans()):
            options += [
                "--name",
                data.draw(st.sampled_from(["", ".", "..", "../../x", "run.rank0", "ok", "a/b"])),
            ]
        inputs = snapshot(inside)
        argv, entry = merge_command(data, [*sorted(map(str, inside.glob("*.jsonl"))), *options])
        code, _, err = run_main(argv, entry)
        assert code in (0, 1, 2)
        if code == 2:
            assert one_line(err), err
        assert {k: v for k, v in snapshot(inside).items() if k in inputs} == inputs
        assert sorted(p.name for p in root.iterdir()) == ["a"]
        assert sorted(p.name for p in (root / "a").iterdir()) == ["d"]


@contextlib.contextmanager
def must_return(seconds: int = PROMPT):
    """Fail, instead of hanging, when the block has not returned within ``seconds``: the alarm
    interrupts a blocking open or read."""

    def hung(signum, frame):
        raise TimeoutError(f"did not return within {seconds} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def memory_cap(extra: int = 1 << 30):
    """Hold this process to the address space it has now plus ``extra`` in the block: a
    command that reads a device without end fails with MemoryError instead of filling the
    machine."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    pages = int(Path("/proc/self/statm").read_text().split()[0])
    cap = pages * resource.getpagesize() + extra
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard < 0 else min(cap, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


ENTRIES = ["fifo", "socket", "device", "dangling", "folder", "empty"]
NAMES = ["x.json", "x.jsonl", "run.rank1.jsonl", "run.json", "ok.rank0.json"]
DEVICES = ["/dev/null", "/dev/zero", "/dev/urandom"]
"""What a device link points at: one that ends when read, and two that never do."""


@given(st.data())
@FUZZ
def test_fuzz_commands_over_folders_holding_odd_files(data):
    lines = rank_lines()
    with tempfile.TemporaryDirectory(prefix="lg") as folder, contextlib.ExitStack() as stack:
        root = Path(folder)
        for name, records in lines.items():
            (root / name).write_text("\n".join(json.dumps(r) for r in records) + "\n")
        assert (
            run_main(["merge", str(root / "run.rank0.jsonl"), str(root / "run.rank1.jsonl")])[0]
            == 0
        )
        for name in data.draw(
            st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True)
        ):
            kind = data.draw(st.sampled_from(ENTRIES))
            path = root / name
            if path.exists():
                path.unlink()
            if kind in ("fifo", "socket", "device"):
                stack.enter_context(odd_file(kind, path, data.draw(st.sampled_from(DEVICES))))
            elif kind == "dangling":
                path.symlink_to(root / "nowhere")
            elif kind == "folder":
                path.mkdir()
            else:
                path.touch()
        ranks = sorted(str(p) for p in root.glob("run.rank*.jsonl"))
        command, entry = data.draw(
            st.sampled_from(
                [
                    (["gate", str(root)], main),
                    (["index", str(root)], main),
                    (["report", str(root / data.draw(st.sampled_from(NAMES)))], main),
                    (["merge", *ranks], main),
                    (ranks, distributed.merge_main),
                    (
                        [
                            "compare",
                            str(root / "run.json"),
                            str(root / data.draw(st.sampled_from(NAMES))),
                        ],
                        main,
                    ),
                ]
            )
        )
        before = snapshot(root)
        with must_return(), memory_cap():
            code, _, err = run_main(command, entry)
        assert code in (0, 1, 2)
        if code == 2:
            assert one_line(err), err
        after = snapshot(root)
        assert {k: v for k, v in after.items() if k in before and k.endswith(".jsonl")} == {
            k: v for k, v in before.items() if k.endswith(".jsonl")
        }

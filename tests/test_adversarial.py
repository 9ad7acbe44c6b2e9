"""Hostile files and folders: a full disk, planted links, a second run in the same folder,
outputs that name inputs, and malformed or generated documents fed to every command."""

import errno
import json
import os

import pytest
from test_cli import clean, write_timeline
from test_report import HEADER, incident

from harness import fsio
from harness.artifacts import write_index
from harness.cli import main
from harness.finish import finish_run
from harness.timeline import TimelineWriter, read_timeline

MB = 2**20


def full_disk_after(monkeypatch, budget):
    """Make ``os.write`` accept ``budget`` bytes in all, then fail with ENOSPC."""
    real = os.write
    left = [budget]

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
    code = main(["report", str(timeline), "--title", "changed"])
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
    assert main(["report", str(timeline)]) == 0
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


def test_a_reader_during_a_write_sees_the_old_file_or_the_new_one(tmp_path, monkeypatch):
    """The index rebuilt while a verdict is half written still reads the previous verdict."""
    timeline = write_timeline(tmp_path / "run.jsonl", clean())
    assert main(["report", str(timeline), "--no-json", "-o", str(tmp_path / "run.md")]) == 0
    assert main(["report", str(timeline)]) == 0
    seen = []
    real_fsync = os.fsync

    def fsync(fd):
        if not seen:
            seen.append(None)
            seen[0] = write_index(tmp_path).read_text()
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    assert main(["report", str(timeline), "--title", "again"]) == 0
    monkeypatch.undo()
    assert "**1 traced run: 1 PASS" in seen[0]
    assert "not leakgate verdicts" not in seen[0]

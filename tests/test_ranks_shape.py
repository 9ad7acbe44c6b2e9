"""Two gloo ranks validating a small model, judged like single runs: each rank runs 176
validation batches with one ``all_gather`` a batch, warmed up with a few collectives first; the
last rank, the logging rank, keeps nothing, an empty summary of what it gathered (0-element
clones: no storage), or 8 MiB of it (176 items). The clean runs pass, the leaking one fails
naming the rank and its holder, and a rank's growth is what the same rank shows unrecorded.

``benchmarks/bench_ranks.py`` runs these shapes many times for their false-alarm rate.
"""

import ctypes
import multiprocessing
import os
import re
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from harness._frontends.spawn import run_ranks
from harness._verdict.options import Rules

BATCHES = 176
WARM_UP = 8
"""Batches each rank runs before its recorded loop (collectives warm the threads that talk)."""
RULES = Rules(phase="validation", max_growth="4MB", warmup=5)
KEEPS = ("nothing", "empty", "8MiB")
KEPT_ROWS = 123
"""Rows of a batch's gathered ``128 x 100`` floats the leaking rank keeps: 49,200 bytes a batch,
8.0 MiB over the loop after its warm-up (what a holder is named for)."""
KB = 2**10


def validate(recorder, keep: str) -> None:
    """The shape (a distributed test body): ``keep`` is what the logging rank keeps a batch."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 100)
    ).eval()
    world = dist.get_world_size()
    logging = dist.get_rank() == world - 1
    summaries = []

    def batch() -> list[torch.Tensor]:
        with torch.no_grad():
            out = model(torch.randn(64, 64))
            gathered = [torch.empty_like(out) for _ in range(world)]
            dist.all_gather(gathered, out)
        return gathered

    for _ in range(WARM_UP):
        batch()
    with recorder.phase("validation", epoch=0):
        for b in range(BATCHES):
            gathered = batch()
            if logging and keep == "empty":
                summaries.append(torch.cat(gathered)[:0].clone())
            elif logging and keep == "8MiB":
                summaries.append(torch.cat(gathered)[:KEPT_ROWS].clone())
            recorder.checkpoint("VALIDATION_BATCH", batch=b)


def judged(keep: str, folder: Path | None = None):
    """The shape through ``run_ranks``, judged by :data:`RULES`."""
    return run_ranks(validate, 2, rules=RULES, args=(keep,), name=f"shape-{keep}", directory=folder)


@pytest.mark.slow  # two spawned ranks, 176 batches each: about 8 s on 2 busy cores
@pytest.mark.parametrize("keep", ["nothing", "empty"])
def test_clean_ranks_pass(keep):
    finished = judged(keep)
    assert finished.verdict.status == "PASS", "\n".join(finished.lines())


@pytest.mark.slow
def test_a_leaking_rank_fails_named_with_its_holder(tmp_path):
    finished = judged("8MiB", tmp_path)
    verdict = finished.verdict
    shown = "\n".join(finished.lines())
    assert verdict.status == "FAIL", shown
    leaks = [f.message for f in verdict.findings if f.kind == "leak"]
    assert any(m.startswith("rank 1: leak in validation") for m in leaks), shown
    assert any(m.startswith("rank 1 of 2 stands out: validation grew") for m in leaks), shown
    assert not any(m.startswith("rank 0") for m in leaks), shown
    held = re.search(r"rank 1: held by (\S+) \(list, 176 items, 8\.0MiB\)", shown)
    assert held is not None, shown
    path = held.group(1)
    assert path.endswith("summaries"), shown
    document = (tmp_path / "shape-8MiB.json").read_text()
    assert f'"path": "rank 1: {path}"' in document and '"items": 176' in document
    report = (tmp_path / "shape-8MiB.md").read_text()
    assert f"held by rank 1: `{path}` (list, 176 items, 8.0MiB)" in report


# -- a rank's growth with and without leakgate ---------------------------------------------------


class _Unrecorded:
    """A stand-in for a recorder that reads the live heap (glibc's ``mallinfo2``, through
    ctypes: no leakgate code) at each batch, and nothing else."""

    class MallInfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in [
                "arena",
                "ordblks",
                "smblks",
                "hblks",
                "hblkhd",
                "usmblks",
                "fsmblks",
                "uordblks",
                "fordblks",
                "keepcost",
            ]
        ]

    def __init__(self) -> None:
        self._mallinfo2 = ctypes.CDLL(None).mallinfo2
        self._mallinfo2.restype = self.MallInfo2
        self.heap: list[int] = []

    def phase(self, name: str, epoch: int | None = None):
        return nullcontext(self)

    def checkpoint(self, label: str, *, batch: int | None = None) -> None:
        info = self._mallinfo2()
        self.heap.append(int(info.uordblks + info.hblkhd))


def _unrecorded_rank(rank: int, port: int, folder: str) -> None:
    """One rank of the shape without leakgate: spawned, gloo, one torch thread, c10d's flight
    recorder off (as ``run_ranks`` has it); its live heap's growth after warm-up to a file."""
    os.environ["TORCH_FR_BUFFER_SIZE"] = "0"
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    reader = _Unrecorded()
    validate(reader, "empty")
    growth = reader.heap[-1] - reader.heap[RULES.warmup]
    Path(folder, f"rank{rank}").write_text(str(growth))
    os._exit(0)  # before torch's teardown, which sometimes crashes a gloo rank


def unrecorded_growth(folder: Path) -> dict[int, int]:
    """Each rank's live heap growth over the shape's recorded loop, with no leakgate loaded."""
    store = dist.TCPStore(
        "127.0.0.1", 0, None, True, timedelta(seconds=120), wait_for_workers=False
    )
    spawn = multiprocessing.get_context("spawn")
    ranks = [
        spawn.Process(target=_unrecorded_rank, args=(r, store.port, str(folder))) for r in (0, 1)
    ]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(120)
        assert process.exitcode == 0
    return {r: int((folder / f"rank{r}").read_text()) for r in (0, 1)}


@pytest.mark.slow
def test_a_rank_grows_recorded_as_it_grows_unrecorded(tmp_path):
    """The logging rank keeping empty summaries grows by tens of KiB either way (its 176 empty
    tensors' own objects): recording it adds no growth of its own, and the verdict says what
    the rank grew."""
    bare = unrecorded_growth(tmp_path)
    finished = judged("empty")
    recorded = {p.rank: p.verdict.phases[0].growth for p in finished.run.ranks}
    shown = f"unrecorded {bare}, recorded {recorded}"
    for rank in (0, 1):
        assert abs(recorded[rank] - bare[rank]) < 256 * KB, shown
    assert finished.verdict.status == "PASS", "\n".join(finished.lines())

"""The reference workload's DataLoader workers (``--num-workers``): the same batches as the
training process makes, made in worker processes, persistent or not, and the ``worker-cache``
fault growing every worker's private memory."""

import contextlib
import json
import multiprocessing
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset, get_worker_info
from workload import Windows, make_model

from tft import faults
from tft import train as train_cli
from tft.config import MAX_WORKERS
from tft.data import Split, load, synth
from tft.loading import Loader
from tft.trainer import TrainConfig, Trainer

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
MiB = 2**20


@pytest.fixture(scope="module")
def bars(tmp_path_factory) -> Path:
    return synth(tmp_path_factory.mktemp("bars") / "small.parquet", rows=1400)


@pytest.fixture(scope="module")
def split(bars) -> Split:
    return load(bars)


def children() -> set[int]:
    """The pids of this process's live children (a thread that ends while they are listed has
    none)."""
    found: set[int] = set()
    for thread in Path(f"/proc/{os.getpid()}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            found.update(int(pid) for pid in (thread / "children").read_text().split())
    return found


def memory(pid: int) -> tuple[int, int]:
    """A process's private memory (``Private_Clean + Private_Dirty`` of its smaps_rollup) and
    its resident memory (``Rss``: a page copied from its parent moves from shared to private,
    so only new pages change it)."""
    lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    private = sum(int(line.split()[1]) for line in lines if line.startswith("Private_"))
    resident = sum(int(line.split()[1]) for line in lines if line.startswith("Rss:"))
    return 1024 * private, 1024 * resident


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- the loader ---------------------------------------------------------------------------------


@pytest.mark.parametrize("persistent", [False, True])
def test_workers_make_the_batches_the_training_process_makes(split, persistent):
    here = Loader(split.train, CPU)
    workers = Loader(split.train, CPU, 2, persistent=persistent)
    n = len(split.train)
    # Two passes (a persistent worker re-reads the plan), a partial last batch, and a share
    # that repeats windows as a DistributedSampler pads it.
    for order, size in ((list(range(n)), 3), ([*range(n - 1, -1, -2), 0, 1], 4)):
        expected = list(here.batches(order, size))
        got = list(workers.batches(order, size, seed=1))
        assert len(got) == len(expected) == -(-len(order) // size)
        assert all(same(a, b) for a, b in zip(expected, got, strict=True))


class WhoMadeIt(Dataset):
    """Windows tagged with the pid and DataLoader worker id of the process that made them."""

    def __init__(self, data):
        self.data = data

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        info = get_worker_info()
        made_by = [os.getpid(), -1 if info is None else info.id]
        return {**self.data[index], "made_by": torch.tensor(made_by)}


def test_batches_are_made_in_worker_processes(split):
    made_by = {
        tuple(row)
        for batch in Loader(WhoMadeIt(split.train), CPU, 2).batches(range(16), 2)
        for row in batch["made_by"].tolist()
    }
    assert {worker for _, worker in made_by} == {0, 1}
    assert len({pid for pid, _ in made_by}) == 2 and os.getpid() not in {p for p, _ in made_by}
    alone = Loader(WhoMadeIt(split.train), CPU).batches(range(4), 2)
    assert {tuple(row) for batch in alone for row in batch["made_by"].tolist()} == {
        (os.getpid(), -1)
    }


# -- the trainer --------------------------------------------------------------------------------


class Seen(Trainer):
    """Keeps the targets of every training step, and runs out of memory above 2 windows."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.targets: list[torch.Tensor] = []

    def train_step(self, batch):
        if len(batch["target"]) > 2:
            raise torch.OutOfMemoryError("out of memory")
        self.targets.append(batch["target"].clone())
        return super().train_step(batch)


@pytest.mark.parametrize("persistent", [False, True])
def test_a_fit_with_workers_is_the_fit_without(persistent):
    """Same seed, same batches (also after out-of-memory back-off), same losses and weights."""

    def fit(**workers) -> Seen:
        config = TrainConfig(epochs=2, batch_size=4, validation_batch_size=3, **workers)
        trainer = Seen(make_model(), config)
        trainer.fit(Windows(14), Windows(7, seed=1))
        return trainer

    before = children()
    alone, helped = fit(), fit(num_workers=2, persistent_workers=persistent)
    # The fit's workers stop with it. A worker slower to leave than the DataLoader waits for
    # (5 s, on a loaded machine) is terminated instead: active_children() reaps it.
    multiprocessing.active_children()
    assert children() == before
    assert helped.state.batch_size == alone.state.batch_size == 2
    assert len(helped.targets) == len(alone.targets) == 14
    assert all(torch.equal(a, b) for a, b in zip(alone.targets, helped.targets, strict=True))
    assert helped.history == alone.history
    weights = alone.model.state_dict()
    assert all(torch.equal(v, weights[k]) for k, v in helped.model.state_dict().items())


# -- the worker-cache fault ---------------------------------------------------------------------


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("fault", [[], ["worker-cache"]])
def test_worker_cache_grows_every_workers_private_memory(split, fault, persistent):
    """The 70 training windows 32 times over, in batches of 32: each worker makes 1120 windows.
    The fault keeps them all (measured: 4.7 to 5.5 MiB of private memory per worker, about 4.7
    KiB a window: four tensors and their dict), the clean dataset none: its workers' private
    memory grows by the parent's pages they copy as they read (0.24 to 0.36 MiB measured alone,
    1.2 MiB forked from a long-lived test process), their new memory (resident) does not."""
    config = TrainConfig(num_workers=2, persistent_workers=persistent)
    trainer = faults.build_trainer(make_model(), config, faults=fault)
    loader = Loader(trainer.dataset(split.train), CPU, 2, persistent=persistent)
    order = list(range(len(split.train))) * 32
    last = -(-len(order) // 32) - 1
    before = children()
    for index, _ in enumerate(loader.batches(order, 32)):
        if index == 2:  # the workers have started and made a batch each
            workers = children() - before
            start = {pid: memory(pid) for pid in workers}
        elif index == last:
            end = {pid: memory(pid) for pid in workers}
    private = [end[pid][0] - start[pid][0] for pid in workers]
    resident = [end[pid][1] - start[pid][1] for pid in workers]
    assert len(workers) == 2
    if fault:
        assert all(g > 3 * MiB for g in private), private
    else:
        assert all(g < 1 * MiB for g in resident), (private, resident)


def test_worker_cache_needs_workers():
    with pytest.raises(ValueError, match="'worker-cache' lives in DataLoader workers"):
        faults.configure(TrainConfig(), ["worker-cache"])
    assert faults.configure(TrainConfig(num_workers=1), ["worker-cache"]).num_workers == 1
    assert "worker-cache" in faults.CATALOGUE and "worker-cache" not in faults.FAULTS


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"num_workers": -1}, ValueError),
        ({"num_workers": MAX_WORKERS + 1}, ValueError),
        ({"num_workers": 1.5}, TypeError),
        ({"num_workers": True}, TypeError),
        ({"persistent_workers": True}, ValueError),
        ({"num_workers": 1, "persistent_workers": "yes"}, TypeError),
    ],
)
def test_config_refuses_bad_worker_settings(fields, error):
    with pytest.raises(error, match=r"num_workers|persistent_workers"):
        TrainConfig(**fields)


# -- python -m tft.train --num-workers ----------------------------------------------------------


def test_the_command_trains_with_workers_and_the_worker_cache_fault(bars, caplog):
    caplog.set_level("INFO", logger="tft.train")
    argv = ["--parquet-file", str(bars), "--epochs", "1", "--hidden-size", "8"]
    assert train_cli.main([*argv, "--num-workers", "2", "--inject-fault", "worker-cache"]) == 0
    assert any("2 DataLoader workers, faults: worker-cache" in r.message for r in caplog.records)


@pytest.mark.slow
def test_ranks_with_workers_train_as_ranks_without(bars):
    """Under ``torchrun`` each rank's workers make that rank's share of the windows: two gloo
    ranks score the same with and without workers."""

    def scores(workers: int) -> list[str]:
        argv = ["--parquet-file", str(bars), "--epochs", "1", "--hidden-size", "8"]
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        done = subprocess.run(
            [*launch, "--nproc-per-node", "2", "-m", "tft.train", *argv, "--num-workers", workers],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**env, "OMP_NUM_THREADS": "1"},
        )
        assert done.returncode == 0, done.stderr
        return re.findall(r"train loss \S+, val loss \S+, q-risk \[[^]]*\]", done.stderr)

    alone = scores("0")
    assert len(alone) == 1 and scores("2") == alone


@pytest.mark.parametrize(
    ("fault", "workers", "code"),
    [
        ([], ["--num-workers", "2"], 0),
        (["worker-cache"], ["--num-workers", "2"], 1),
        ([], ["--num-workers", "8", "--persistent-workers"], 0),
    ],
    ids=["clean", "fault", "clean-8-persistent"],
)
def test_the_traced_command_judges_its_workers(tmp_path, fault, workers, code):
    """``--num-workers 2 --memreport``: the clean run passes, the worker cache fails naming
    the workers (about 4.7 KiB a window, 170 training windows per worker here). A clean run
    with 8 persistent workers passes too: their first start is warmed up before the session
    (without it, 8 workers left 82 KiB more after the session), and all of them together may
    grow 8 times what one may. In a process of its own, as a user runs it: workers forked from
    a long-lived test process inherit a heap with free space the cache fills, pages that then
    read as copied rather than new."""
    bars = synth(tmp_path / "bars.parquet", rows=7000)
    argv = ["--parquet-file", str(bars), "--epochs", "1", "--hidden-size", "8"]
    argv += [*workers, "--memreport", str(tmp_path / "run")]
    argv += [a for f in fault for a in ("--inject-fault", f)]
    run = subprocess.run([sys.executable, "-m", "tft.train", *argv], capture_output=True, text=True)
    assert run.returncode == code, run.stdout + run.stderr[-3000:]
    (document,) = (tmp_path / "run").glob("tft-train-*.json")
    findings = json.loads(document.read_text())["findings"]
    leaks = [f for f in findings if f["kind"] == "child-leak"]
    if fault:
        assert leaks and re.search(r"worker [01] \+", leaks[0]["message"])
    else:
        assert not leaks

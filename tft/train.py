"""``python -m tft.train``: train the TFT on 1-minute futures bars.

Without ``--parquet-file`` the default synthetic file (704 training and 176 validation windows)
is generated into the cache folder. ``--inject-fault NAME`` trains a known faulty variant
(:mod:`tft.faults`). ``--memreport DIR`` traces memory at the trainer's checkpoints, judges the
timeline with :func:`memory_rules` (the budgets in ``tft/budgets.json``, checked before any
work) and writes ``DIR/<run>.jsonl``, ``.json`` and ``.md``; ``--capacity`` emulates a
smaller device (and traces the run too). ``--num-workers N`` has N DataLoader worker processes
make the batches (:mod:`tft.loading`; default 0, the incident's set-up: the training process
makes them). Exit codes: 0 done (with a passing verdict when traced), 1 out of memory or a
failing verdict, 2 bad input (a budgets file included) or a timeline or report that cannot be
written (one line).

Under ``torchrun`` (``WORLD_SIZE`` set) every rank joins the default process group (NCCL with
one rank per visible GPU, ``cuda:LOCAL_RANK``; gloo on the CPU) and the trainer runs DDP. A
traced run writes one timeline per rank (``DIR/<run>.rank<N>.jsonl``); after training, every
rank is judged on its own, rank 0 merges the ranks into one verdict and one report
(``DIR/<run>.json`` and ``.md``, every rank in its own column), and every rank exits with the
merged verdict's code. A traced run turns c10d's flight recorder off unless
``TORCH_FR_BUFFER_SIZE`` is set (it keeps the last 2000 collectives, which reads as growth).
Only rank 0 logs progress and writes checkpoints.
"""

from __future__ import annotations

import argparse
import gc
import logging
import math
import os
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import torch
from torch.utils.data import Dataset, default_collate

from tft import arguments, faults
from tft.arguments import build_parser
from tft.checkpoint import CheckpointError
from tft.checks import watch
from tft.config import TrainConfig, resolve_device
from tft.data import DataError, Split, default_parquet, load
from tft.launch import leave, process_group, rank_config
from tft.loading import Batch, Loader
from tft.model import TemporalFusionTransformer, TFTConfig
from tft.progress import Progress
from tft.qat import export_int8
from tft.scoring import Accumulator, baseline_q_risk
from tft.trainer import Callback, Trainer

if TYPE_CHECKING:
    from harness._recorder import Recorder
    from harness._verdict.options import Rules

__all__ = ["batch_shapes", "build_parser", "leave", "main", "memory_rules", "warm_up"]

log = logging.getLogger("tft.train")


class MemoryRules(TypedDict):
    """Keyword arguments of ``harness.Rules``, as far as a traced run sets them."""

    phase: tuple[str, ...]
    max_growth: str | int
    warmup: int
    max_peak: str | int
    teardown: str | int


BUDGETS = Path(__file__).with_name("budgets.json")
"""The main job's budgets (``max_growth``, ``max_peak``, ``teardown``) and the measurements
they were set from: ``benchmarks/budgets.py`` runs the clean job several times and writes it."""
BUDGET_KEYS = ("max_growth", "max_peak", "teardown")


def memory_rules(path: Path | None = None) -> MemoryRules:
    """The ``harness.Rules`` a traced run is judged by: its budgets read from ``path``
    (default :data:`BUDGETS`), set from the spread of the default workload's clean runs (704
    training and 176 validation windows, batch size 1, 5 epochs; ``reports/README.md`` has the
    numbers behind them).

    Raises ``harness._core.errors.BadInput`` naming the file and the key for a file that cannot be
    read or is not JSON, and for budgets that are not exactly the three sizes."""
    from harness._core.errors import BadInput
    from harness._core.json_values import read_json
    from harness._core.units import parse_size

    path = BUDGETS if path is None else path
    document = read_json(path)
    budgets = document.get("budgets") if isinstance(document, dict) else None
    if not isinstance(budgets, dict):
        raise BadInput("expected an object of sizes", path=path, field="budgets")
    unknown = sorted(set(budgets) - set(BUDGET_KEYS))
    if unknown:
        problem = f"not a budget (known: {', '.join(BUDGET_KEYS)})"
        raise BadInput(problem, path=path, field=f"budgets.{unknown[0]}")
    for key in BUDGET_KEYS:
        if key not in budgets:
            raise BadInput("missing", path=path, field=f"budgets.{key}")
        try:
            parse_size(budgets[key], what=f"budgets.{key}")
        except BadInput as exc:
            raise BadInput(exc.problem, path=path, field=exc.field) from None
    return {
        "phase": ("training", "validation"),
        "max_growth": budgets["max_growth"],
        "warmup": 5,
        "max_peak": budgets["max_peak"],
        "teardown": budgets["teardown"],
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except arguments.UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    level = args.log_level.upper()
    if os.environ.get("RANK", "0").strip() not in ("", "0"):
        level = max(level, "WARNING", key=logging.getLevelName)
    logging.basicConfig(level=level, format="%(message)s", stream=sys.stderr)
    if "list" in args.inject_fault:
        for fault in faults.CATALOGUE.values():
            print(f"{fault.name:<22} {fault.summary}")
        return 0
    tracing = args.memreport is not None or args.capacity is not None
    try:
        arguments.check(args)
        rules = memory_rules() if tracing else None
        torch.set_num_threads(args.threads)
        config = TrainConfig(
            batch_size=args.batch_size,
            validation_batch_size=args.validation_batch_size,
            epochs=args.epochs,
            lr=args.lr,
            device=args.device,
            seed=args.seed,
            qat=args.qat,
            checkpoint_dir=str(args.checkpoint_dir) if args.checkpoint_dir else None,
            num_workers=args.num_workers,
            persistent_workers=args.persistent_workers,
        )
        config = faults.configure(config, args.inject_fault)
        config = rank_config(config)
        split = load(args.parquet_file or default_parquet())
        model_config = TFTConfig(
            static_cardinalities=split.train.static_cardinalities,
            n_observed=split.train.n_observed,
            n_known=split.train.n_known,
            encoder_length=split.train.spec.encoder_length,
            decoder_length=split.train.spec.decoder_length,
            hidden_size=args.hidden_size,
        )
    except (DataError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.resume:
        last = Path(config.checkpoint_dir or ".") / "last.pt"
        if not last.is_file():
            print(f"error: --resume needs {last}", file=sys.stderr)
            return 2
        try:
            check_resume(last, config, model_config)
        except CheckpointError as exc:
            print(f"error: --resume: {exc}", file=sys.stderr)
            return 2
    if rules is not None and "WORLD_SIZE" in os.environ:
        from harness._frontends.spawn import quiet_flight_recorder

        quiet_flight_recorder()
    with process_group(config):
        if rules is not None:
            return traced(args, config, model_config, split, argv, rules)
        try:
            train(args, config, model_config, split)
        except torch.OutOfMemoryError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0


def check_resume(path: Path, config: TrainConfig, model_config: TFTConfig) -> None:
    """Load ``path`` into a throwaway trainer on the CPU, so that a checkpoint that cannot resume
    this run is refused before any work; the random state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        model = TemporalFusionTransformer(model_config)
        Trainer(model, replace(config, device="cpu")).load_checkpoint(path)


def train(
    args: argparse.Namespace,
    config: TrainConfig,
    model_config: TFTConfig,
    split: Split,
    callbacks: Sequence[Callback] = (),
    sink: Callback | None = None,
) -> None:
    """Build the model and the trainer (with the faults asked for), train and log the outcome.

    ``sink`` receives failed trainer-invariant checks. Nothing built here outlives the call
    unless a fault keeps it. Raises ``torch.OutOfMemoryError`` when training runs out of memory.
    """
    torch.manual_seed(args.seed)
    model = TemporalFusionTransformer(model_config)
    trainer = faults.trainer_class(args.inject_fault)(model, config, callbacks)
    if trainer.rank == 0:
        trainer.callbacks.append(Progress(trainer, len(split.train), len(split.val), sys.stderr))
    if sink is not None:
        watch(trainer, sink)
    if args.resume:
        trainer.load_checkpoint(Path(config.checkpoint_dir or ".") / "last.pt")
    log.info(
        "%d training / %d validation windows, batch %d / validation batch %d, device %s%s%s%s",
        len(split.train),
        len(split.val),
        config.batch_size,
        config.validation_batch_size,
        trainer.device,
        f", {trainer.world_size} ranks (DDP)" if trainer.world_size > 1 else "",
        f", {config.num_workers} DataLoader workers" if config.num_workers else "",
        f", faults: {', '.join(args.inject_fault)}" if args.inject_fault else "",
    )
    started = time.perf_counter()
    history = trainer.fit(split.train, split.val)
    base = baseline_q_risk(split.train, split.val, trainer.quantiles)
    final = history[-1].q_risk
    log.info(
        "done in %.1fs: validation q-risk %s vs constant-quantile baseline %s (mean %.4f vs %.4f)",
        time.perf_counter() - started,
        " ".join(f"{r:.4f}" for r in final),
        " ".join(f"{r:.4f}" for r in base),
        sum(final) / len(final),
        sum(base) / len(base),
    )
    if config.qat and config.checkpoint_dir and trainer.rank == 0:
        path = Path(config.checkpoint_dir) / "model-int8.pt"
        torch.save(export_int8(trainer.model), path)
        log.info("INT8 export written to %s", path)


def traced(
    args: argparse.Namespace,
    config: TrainConfig,
    model_config: TFTConfig,
    split: Split,
    argv: Sequence[str],
    rules: MemoryRules,
) -> int:
    """Train under a memory recorder, judge the timeline with ``rules`` (:func:`memory_rules`),
    print the verdict and, with ``--memreport``, save the run; 1 when the verdict is not PASS.

    The session is framed by collected ``session START``/``session END`` checkpoints taken
    before the model exists and after everything :func:`train` built is gone, so the
    teardown rule sees what a finished session leaves behind.
    """
    # The one exception to "tft never imports harness": tracing from the command line. The
    # imports stay inside the functions it calls, so the model, data, trainer and faults load
    # without it.
    from harness._verdict.options import Rules

    name = "tft-train-" + ("+".join(args.inject_fault) or "clean")
    title = f"TFT training, {', '.join(args.inject_fault) or 'no faults'}"
    try:
        capacity = _capacity(args)
        judged = Rules(**rules)
        warm_up(faults.trainer_class(args.inject_fault), config, model_config, split)
        _check_capacity(args, config, capacity)
        recorder = _recorder(args, config, split, argv, judged, capacity, name, title)
    except _Refused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return _traced_session(args, config, model_config, split, recorder, name, title)


class _Refused(Exception):
    """A traced run refused before its session starts: one line, exit code 2."""


def _capacity(args: argparse.Namespace) -> int | None:
    """``--capacity`` in bytes, None without it."""
    from harness._core.units import parse_size

    try:
        return None if args.capacity is None else parse_size(args.capacity, what="--capacity")
    except ValueError as exc:
        raise _Refused(str(exc)) from None


def _check_capacity(args: argparse.Namespace, config: TrainConfig, capacity: int | None) -> None:
    """An emulated ``capacity`` above what the process holds before training starts."""
    if capacity is not None:
        held = held_at_start(str(resolve_device(config.device)), capacity)
        if held is not None:
            raise _Refused(f"--capacity {args.capacity}: {held}")


def _recorder(
    args: argparse.Namespace,
    config: TrainConfig,
    split: Split,
    argv: Sequence[str],
    rules: Rules,
    capacity: int | None,
    name: str,
    title: str,
) -> Recorder:
    """The session's recorder, writing ``<name>.jsonl`` into ``--memreport`` when given, ready to
    name holders past ``rules``' budgets."""
    from harness._attribution.phase import PhaseAttribution
    from harness._recorder import Recorder

    meta = {
        "title": title,  # a report rebuilt from the timeline is titled as the run's own
        "train_samples": len(split.train),
        "val_samples": len(split.val),
        "faults": list(args.inject_fault),
        "command": shlex.join(["python", "-m", "tft.train", *argv]),
    }
    try:
        return Recorder(
            str(resolve_device(config.device)),
            capacity=capacity,
            timeline=None if args.memreport is None else args.memreport / f"{name}.jsonl",
            config=config,
            meta=meta,
            attribute=PhaseAttribution.for_rules(rules),
            rules=rules,
        )
    except OSError as exc:  # the timeline cannot be created: a link in the way, no such place
        raise _Refused(f"{exc.filename or args.memreport}: {exc.strerror or exc}") from None


def _traced_session(
    args: argparse.Namespace,
    config: TrainConfig,
    model_config: TFTConfig,
    split: Split,
    recorder: Recorder,
    name: str,
    title: str,
) -> int:
    """Train in the recorder's ``session`` phase, then finish the run (merged across ranks
    under ``torchrun``); the exit code."""
    from harness._results.finish import finish_run
    from harness._results.merge import finish_distributed

    # The session's peak window starts from the released level: the warm-up's is not its own.
    gc.collect()
    recorder.probe.release()
    recorder.probe.reset_peak()
    error = None
    started = time.perf_counter()
    with recorder:
        try:
            with recorder.phase("session", collect=True):
                try:
                    train(args, config, model_config, split, [recorder], sink=recorder)
                except torch.OutOfMemoryError as exc:
                    print(f"error: {exc}", file=sys.stderr)
                    error = exc.with_traceback(None)
        except torch.OutOfMemoryError as exc:  # still over the capacity at the session's END
            print(f"error: {exc}", file=sys.stderr)
            error = error or exc.with_traceback(None)
        finish = finish_distributed if recorder.rank is not None else finish_run
        finished = finish(recorder, name=name, error=error, directory=args.memreport, title=title)
        faults.reset()
    if recorder.rank is not None and recorder.rank.rank != 0:
        return 0 if finished.verdict.passed else 1
    print(f"traced in {time.perf_counter() - started:.1f}s")
    return finished.exit_code()


def held_at_start(device: str, capacity: int) -> str | None:
    """Why an emulated ``capacity`` cannot work, when the process already holds more than it
    before training starts (both figures); None when it fits."""
    from harness._core.units import format_size
    from harness._measure.probes import make_probe

    gc.collect()
    probe = make_probe(device)
    try:
        probe.release()
        level = probe.sample().get(probe.capacity_metric)
    finally:
        probe.close()
    if level is None or level <= capacity:
        return None
    return (
        f"{format_size(capacity)} is below what the process already holds before training: "
        f"{format_size(level)} ({probe.capacity_metric} on {probe.name})"
    )


DDP_WARM_STEPS = 64
"""Extra training and validation steps the warm-up runs under DDP. Measured on a CPU with gloo:
the first hundred or so DDP steps of a process leave 15-30 KB more allocated (glibc's
per-thread caches of the threads that communicate filling up), then stay flat; after 64
warm-up steps a traced epoch grows by about 1 KB. Validation steps go through the trainer's
``validate_step``, so the collectives a trainer makes there are warmed up too."""


def warm_up(
    trainer_class: type[Trainer], config: TrainConfig, model_config: TFTConfig, split: Split
) -> None:
    """Run every batch shape a session can meet once, with a throwaway model and trainer of the
    session's class, so that one-time allocations happen before a traced session starts.

    Measured on a CPU: the first forward pass leaves about 33 MB allocated for good, and oneDNN
    caches its LSTM primitives per batch size and autograd mode (about 165 KB per LSTM for each
    new one). The shapes are each configured batch size, the sizes out-of-memory back-off can
    halve it to, and the last, partial batch of each. With DataLoader workers, one pass of a
    batch per worker starts and stops them: what a first start leaves in this process for good
    (multiprocessing's modules, the warning that more workers than CPUs were asked for, with
    the source lines it quotes: 8 workers left 330 KiB after a session against 186 KiB with
    none) is then not the session's.
    """
    trainer = trainer_class(TemporalFusionTransformer(model_config), config)
    world = trainer.world_size

    def batch(data: Dataset, size: int) -> Batch:
        rows = default_collate([data[i] for i in range(size)])
        return {k: v.to(trainer.device) for k, v in rows.items()}

    n_train, n_val = math.ceil(len(split.train) / world), math.ceil(len(split.val) / world)
    for size in batch_shapes(n_train, config.batch_size, config.oom_retries):
        trainer.train_step(batch(split.train, size))
    if world > 1:
        for _ in range(DDP_WARM_STEPS):
            trainer.train_step(batch(split.train, config.batch_size))
    trainer.model.eval()
    with trainer.validation_mode():
        val_size = config.validation_batch_size or config.batch_size
        for size in batch_shapes(n_val, val_size, config.oom_retries):
            trainer.model(batch(split.val, size))
        if world > 1:
            acc = Accumulator()
            for _ in range(DDP_WARM_STEPS):
                trainer.validate_step(batch(split.val, val_size), acc)
    if config.num_workers:
        loader = Loader(
            trainer.dataset(split.train),
            trainer.device,
            config.num_workers,
            persistent=config.persistent_workers,
        )
        for _ in loader.batches(range(min(n_train, config.num_workers)), 1):
            pass
        del loader


def batch_shapes(n: int, size: int, halvings: int) -> list[int]:
    """Batch sizes ``n`` windows can come in: ``size`` and up to ``halvings`` halvings of it,
    each with its last, partial batch."""
    sizes = [max(1, size >> k) for k in range(halvings + 1)]
    shapes = {min(n, s) for s in sizes} | {n % s for s in sizes if n % s}
    return sorted(shapes, reverse=True)


if __name__ == "__main__":
    leave(main())

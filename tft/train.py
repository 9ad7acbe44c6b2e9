"""``python -m tft.train``: train the TFT on 1-minute futures bars.

Without ``--parquet-file`` the default synthetic file (704 training and 176 validation windows)
is generated into the cache folder. Exit codes: 0 done, 1 out of memory, 2 bad input.
"""

from __future__ import annotations

import argparse
import logging
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import torch

from tft.data import DataError, default_parquet, load
from tft.model import TemporalFusionTransformer, TFTConfig
from tft.qat import export_int8
from tft.trainer import EpochStats, TrainConfig, Trainer, baseline_q_risk

log = logging.getLogger("tft.train")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tft.train", description=__doc__.splitlines()[0])
    p.add_argument("--parquet-file", type=Path, help="bars to train on (default: synthetic file)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument(
        "--validation-batch-size",
        type=int,
        default=None,
        help="defaults to --batch-size, as in TrainConfig",
    )
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden-size", type=int, default=TFTConfig.hidden_size)
    p.add_argument("--qat", action="store_true", help="quantisation-aware training, INT8 export")
    p.add_argument("--checkpoint-dir", type=Path, help="save every epoch here (and resume from)")
    p.add_argument("--resume", action="store_true", help="continue from CHECKPOINT_DIR/last.pt")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


class Progress:
    """A per-epoch progress line on a terminal (quartile log lines otherwise), and a summary
    line at the end of each epoch."""

    def __init__(self, trainer: Trainer, n_train: int, n_val: int, stream: TextIO) -> None:
        self.trainer, self.stream = trainer, stream
        self.totals = {"training": n_train, "validation": n_val}
        self.tty = stream.isatty()
        self.last_quarter = -1

    def __call__(self, label: str, *, phase: str, epoch: int, batch: int | None, **_: Any) -> None:
        if label == "EPOCH_END":
            stats = self.trainer.history[-1]
            log.info(format_epoch(stats, self.trainer.config.epochs, self.trainer.device))
            return
        if label not in ("TRAIN_BATCH", "VALIDATION_BATCH") or batch is None:
            return
        state = self.trainer.state
        size = state.batch_size if phase == "training" else state.validation_batch_size
        total = self.totals[phase]
        done = min(total, (batch + 1) * size)
        head = f"epoch {epoch + 1}/{self.trainer.config.epochs} {phase}"
        if self.tty:
            width = 30
            bar = "#" * (width * done // total)
            end = "\n" if done == total else ""
            self.stream.write(f"\r{head} [{bar:<{width}}] {done}/{total}{end}")
            self.stream.flush()
            return
        quarter = 4 * done // total
        if quarter != self.last_quarter:
            self.last_quarter = quarter
            log.info("%s %d/%d windows", head, done, total)


def memory_summary(device: torch.device) -> str:
    if device.type == "cuda":
        alloc = torch.cuda.memory_allocated(device) / 2**20
        reserved = torch.cuda.memory_reserved(device) / 2**20
        return f"cuda allocated {alloc:.1f}MB reserved {reserved:.1f}MB"
    scale = 1 if sys.platform == "darwin" else 1024
    return f"cpu max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20:.1f}MB"


def format_epoch(stats: EpochStats, epochs: int, device: torch.device) -> str:
    risks = " ".join(f"{r:.3f}" for r in stats.q_risk)
    return (
        f"epoch {stats.epoch + 1}/{epochs}: train loss {stats.train_loss:.4f}, "
        f"val loss {stats.val_loss:.4f}, q-risk [{risks}], {memory_summary(device)}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(message)s", stream=sys.stderr)
    try:
        config = TrainConfig(
            batch_size=args.batch_size,
            validation_batch_size=args.validation_batch_size,
            epochs=args.epochs,
            lr=args.lr,
            device=args.device,
            seed=args.seed,
            qat=args.qat,
            checkpoint_dir=str(args.checkpoint_dir) if args.checkpoint_dir else None,
        )
        split = load(args.parquet_file or default_parquet())
        torch.manual_seed(args.seed)
        model = TemporalFusionTransformer(
            TFTConfig(
                static_cardinalities=split.train.static_cardinalities,
                n_observed=split.train.n_observed,
                n_known=split.train.n_known,
                encoder_length=split.train.spec.encoder_length,
                decoder_length=split.train.spec.decoder_length,
                hidden_size=args.hidden_size,
            )
        )
    except (DataError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    trainer = Trainer(model, config)
    trainer.callbacks.append(Progress(trainer, len(split.train), len(split.val), sys.stderr))
    if args.resume:
        last = Path(config.checkpoint_dir or ".") / "last.pt"
        if not last.is_file():
            print(f"error: --resume needs {last}", file=sys.stderr)
            return 2
        trainer.load_checkpoint(last)
    log.info(
        "%d training / %d validation windows, batch %d / validation batch %d, device %s",
        len(split.train),
        len(split.val),
        config.batch_size,
        config.validation_batch_size,
        trainer.device,
    )
    started = time.perf_counter()
    try:
        history = trainer.fit(split.train, split.val)
    except torch.OutOfMemoryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
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
    if config.qat and config.checkpoint_dir:
        path = Path(config.checkpoint_dir) / "model-int8.pt"
        torch.save(export_int8(trainer.model), path)
        log.info("INT8 export written to %s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

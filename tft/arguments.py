"""The command line of ``python -m tft.train``: its options, and the checks on them that need
no data, so that bad input is refused before any work starts."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

from tft import faults
from tft.model import TFTConfig
from tft.paths import write_problem


class UsageError(ValueError):
    """An option argparse refuses (unknown, missing its value, not a number): one line."""


class Parser(argparse.ArgumentParser):
    """An argument parser that raises :class:`UsageError` where argparse would print its usage
    and exit, so that the command answers bad input with one line, as for every other check."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m tft.train", description=__doc__.splitlines()[0])
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
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: a batch-1 step gains nothing from more, measured "
        "7.9 vs 8.6 ms, and loses badly when other processes share the cores)",
    )
    p.add_argument(
        "--num-workers",
        type=int,
        default=0,
        metavar="N",
        help="DataLoader worker processes that make the batches (default 0: this process does)",
    )
    p.add_argument(
        "--persistent-workers",
        action="store_true",
        help="keep the workers from epoch to epoch (needs --num-workers)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument(
        "--inject-fault",
        action="append",
        default=[],
        metavar="NAME",
        help="train a known faulty variant, repeatable ('list' describes them): "
        + ", ".join(faults.CATALOGUE),
    )
    p.add_argument(
        "--memreport",
        type=Path,
        metavar="DIR",
        help="trace memory, judge it and write DIR/<run>.jsonl, <run>.json and <run>.md",
    )
    p.add_argument(
        "--capacity", metavar="SIZE", help="emulate a device of SIZE (e.g. 600MB); traces the run"
    )
    return p


def check(args: argparse.Namespace) -> None:
    """Refuse options that cannot work whatever the data (``ValueError``, one line)."""
    if args.threads < 1:
        raise ValueError(f"--threads must be at least 1, got {args.threads}")
    if args.memreport is not None and (problem := write_problem(args.memreport, folder=True)):
        raise ValueError(f"--memreport {args.memreport}: {problem}")

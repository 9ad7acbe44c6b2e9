"""Bars from parquet: schema and value checks, per-bar inputs, and the TFT's training and
validation windows (:func:`load`). The synthetic bars come from :mod:`tft.synthetic` (their
names are re-exported here); ``python -m tft.data synth|info`` writes a file or describes one.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset

from tft.paths import write_problem
from tft.synthetic import (
    DEFAULT_FILE,
    DEFAULT_ROWS,
    DEFAULT_SEED,
    TICK,
    cache_dir,
    default_parquet,
    synth,
    synth_bars,
)

__all__ = [
    "DEFAULT_FILE",
    "DEFAULT_ROWS",
    "DEFAULT_SEED",
    "DEFAULT_SPEC",
    "TICK",
    "DataError",
    "Normalisation",
    "Series",
    "Split",
    "WindowDataset",
    "WindowSpec",
    "cache_dir",
    "default_parquet",
    "load",
    "main",
    "synth",
    "synth_bars",
]

PRICES = ("open", "high", "low", "close")
COLUMNS = ("ts", "symbol", *PRICES, "volume")
OBSERVED = ("log_return", "range", "log_volume", "realised_vol")
KNOWN = ("tod_sin", "tod_cos", "dow_sin", "dow_cos")
REALISED_VOL_BARS = 30
SESSION_GAP_MINUTES = 30

_MINUTE_NS = 60 * 10**9
_DAY_NS = 1440 * _MINUTE_NS
_NS_RANGE = "1677-09-21..2262-04-11"


class DataError(ValueError):
    """A parquet file that cannot serve as bars; the message names the file and the problem."""


@dataclass(frozen=True)
class WindowSpec:
    """Window geometry in bars: encoder (past) steps, decoder (target) steps, start spacing."""

    encoder_length: int = 60
    decoder_length: int = 10
    stride: int = 15

    def __post_init__(self) -> None:
        for name in ("encoder_length", "decoder_length", "stride"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"WindowSpec.{name} must be a positive int, got {value!r}")

    @property
    def length(self) -> int:
        """Bars in one window."""
        return self.encoder_length + self.decoder_length


DEFAULT_SPEC = WindowSpec()


@dataclass(frozen=True)
class Normalisation:
    """Mean and standard deviation of each observed input, fitted on rows ``[0, rows)``."""

    names: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    rows: int


@dataclass(frozen=True, eq=False)
class Series:
    """Whole-series tensors; the windows of both datasets are views of them."""

    observed: torch.Tensor  # [rows, n_observed] float32, normalised
    known: torch.Tensor  # [rows, n_known] float32
    target: torch.Tensor  # [rows] float32, normalised log return
    static: torch.Tensor  # [1] int64, symbol index
    timestamps: np.ndarray  # [rows] datetime64[ns], UTC
    static_cardinalities: tuple[int, ...]


class WindowDataset(Dataset[dict[str, torch.Tensor]]):
    """Windows of one series, each a dict of views: ``static`` [1], ``observed`` [encoder, 4],
    ``known`` [encoder + decoder, 4], ``target`` [decoder]."""

    n_observed = len(OBSERVED)
    n_known = len(KNOWN)

    def __init__(self, series: Series, starts: np.ndarray, spec: WindowSpec) -> None:
        self.series = series
        self.starts = starts
        self.spec = spec

    @property
    def static_cardinalities(self) -> tuple[int, ...]:
        return self.series.static_cardinalities

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        start = int(self.starts[i])
        split = start + self.spec.encoder_length
        end = start + self.spec.length
        s = self.series
        return {
            "static": s.static[:],
            "observed": s.observed[start:split],
            "known": s.known[start:end],
            "target": s.target[split:end],
        }

    def window_times(self, i: int) -> np.ndarray:
        """Timestamps (datetime64[ns], UTC) of the encoder and decoder bars of window ``i``."""
        start = int(self.starts[i])
        return self.series.timestamps[start : start + self.spec.length]


@dataclass(frozen=True, eq=False)
class Split:
    """Training and validation windows of one file, with what was fitted on it."""

    train: WindowDataset
    val: WindowDataset
    normalisation: Normalisation
    path: Path
    n_rows: int
    symbols: tuple[str, ...]
    start: np.datetime64
    end: np.datetime64


# --- loading ----------------------------------------------------------------------------------


def load(path: str | os.PathLike[str], spec: WindowSpec = DEFAULT_SPEC) -> Split:
    """Read bars from ``path`` (one symbol per file), derive inputs and split into windows.

    Inputs per bar: observed (past only) log return, log(high/low), log(1 + volume) and
    realised volatility (std of the last 30 log returns); known (past and future) sin/cos of the
    UTC time of day and of the day of week; static the symbol's index. The target is the
    normalised log return. Normalisation is fitted on the rows up to the last training target.

    Raises :class:`DataError` for a missing or unreadable file, missing or mistyped columns,
    missing, NaN, infinite or non-positive prices or volumes, timestamps not strictly
    increasing, or too few bars for one training and one validation window.
    """
    path = Path(path)
    table = _read(path)
    ts = _timestamps(path, table["ts"])
    prices = {name: table[name].cast(pa.float64()).to_numpy() for name in PRICES}
    volume = table["volume"].cast(pa.float64()).to_numpy()
    symbols = tuple(pc.unique(table["symbol"].cast(pa.string())).to_pylist())
    _check_values(path, ts, prices, volume, symbols)

    train_starts, val_starts = _split_windows(path, ts, spec)
    fit_rows = int(train_starts[-1]) + spec.length
    observed = _observed(prices, volume)
    mean, std = observed[:fit_rows].mean(axis=0), observed[:fit_rows].std(axis=0)
    std = np.where(std > 0, std, 1.0)
    normalised = torch.from_numpy(((observed - mean) / std).astype(np.float32))
    series = Series(
        observed=normalised,
        known=torch.from_numpy(_known(ts).astype(np.float32)),
        target=normalised[:, 0].contiguous(),
        static=torch.zeros(1, dtype=torch.int64),
        timestamps=ts.astype("datetime64[ns]"),
        static_cardinalities=(len(symbols),),
    )
    return Split(
        train=WindowDataset(series, train_starts, spec),
        val=WindowDataset(series, val_starts, spec),
        normalisation=Normalisation(OBSERVED, tuple(mean.tolist()), tuple(std.tolist()), fit_rows),
        path=path,
        n_rows=len(ts),
        symbols=symbols,
        start=series.timestamps[0],
        end=series.timestamps[-1],
    )


def _read(path: Path) -> pa.Table:
    """The needed columns of ``path``, after checking that they exist with usable types."""
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: not a parquet file ({str(exc).splitlines()[0]})") from None
    missing = [name for name in COLUMNS if name not in schema.names]
    if missing:
        raise DataError(f"{path}: missing column(s) {', '.join(missing)}")
    expected = {
        "ts": ("a timestamp", pa.types.is_timestamp),
        "symbol": ("a string", lambda t: pa.types.is_string(t) or pa.types.is_large_string(t)),
        "volume": ("a number", lambda t: pa.types.is_integer(t) or pa.types.is_floating(t)),
        **{name: ("a float", pa.types.is_floating) for name in PRICES},
    }
    for name, (kind, check) in expected.items():
        found = schema.field(name).type
        if not check(found):
            raise DataError(f"{path}: column {name} has type {found}, expected {kind}")
    try:
        table = pq.read_table(path, columns=list(COLUMNS))
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: cannot read ({str(exc).splitlines()[0]})") from None
    for name in COLUMNS:
        if table[name].null_count:
            raise DataError(f"{path}: column {name} has {table[name].null_count} missing values")
    return table


def _timestamps(path: Path, column: pa.ChunkedArray) -> np.ndarray:
    """``column`` as int64 nanoseconds since the epoch (UTC), or a :class:`DataError` for values
    that nanoseconds cannot hold (before 1677-09-21 or after 2262-04-11)."""
    try:
        ns = column.cast(pa.timestamp("ns", tz=column.type.tz)).cast(pa.int64()).to_numpy()
    except pa.ArrowInvalid:
        raise DataError(
            f"{path}: column ts has timestamps outside {_NS_RANGE} (what int64 nanoseconds hold)"
        ) from None
    # The smallest int64 is numpy's NaT, not a time.
    nat = np.flatnonzero(ns == np.iinfo(np.int64).min)
    if nat.size:
        raise DataError(f"{path}: column ts has an invalid timestamp (row {nat[0]})")
    return ns


def _check_values(
    path: Path,
    ts: np.ndarray,
    prices: dict[str, np.ndarray],
    volume: np.ndarray,
    symbols: tuple[str, ...],
) -> None:
    for name, values in (*prices.items(), ("volume", volume)):
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            raise DataError(f"{path}: column {name} has NaN or infinite values (row {bad[0]})")
    for name, values in prices.items():
        if (values <= 0).any():
            raise DataError(f"{path}: column {name} has non-positive prices")
    if (volume < 0).any():
        raise DataError(f"{path}: column volume has negative values")
    if len(symbols) > 1:
        raise DataError(f"{path}: {len(symbols)} symbols ({', '.join(symbols)}); one per file")
    back = np.flatnonzero(ts[1:] <= ts[:-1])
    if back.size:
        row = int(back[0]) + 1
        when = ts[row].astype("datetime64[ns]")
        raise DataError(f"{path}: timestamps not strictly increasing at row {row} ({when})")


def _split_windows(path: Path, ts: np.ndarray, spec: WindowSpec) -> tuple[np.ndarray, np.ndarray]:
    """Start rows of the training and validation windows.

    A window is ``spec.length`` consecutive bars of one session (a gap of more than 30 minutes
    starts a new one), starting every ``spec.stride`` bars from the session's first bar. The
    first 80% of the windows (in time) train; of the rest, a window validates only if its first
    target bar comes after the last training target bar, so no validation target lies in the
    training range.
    """
    if len(ts) < spec.length:
        raise DataError(f"{path}: {len(ts)} rows, fewer than one window ({spec.length} bars)")
    # Increasing int64 times can be more than 2**63 ns apart: their wrapped difference, read as
    # unsigned, is still exact.
    gaps = np.diff(ts).view(np.uint64)
    breaks = np.flatnonzero(gaps > SESSION_GAP_MINUTES * _MINUTE_NS) + 1
    bounds = np.concatenate(([0], breaks, [len(ts)]))
    starts = np.concatenate(
        [np.arange(a, b - spec.length + 1, spec.stride) for a, b in pairwise(bounds)]
    ).astype(np.int64)
    n_train = len(starts) * 4 // 5
    train, rest = starts[:n_train], starts[n_train:]
    val = rest[rest + spec.encoder_length >= train[-1] + spec.length] if n_train else rest[:0]
    if not (len(train) and len(val)):
        raise DataError(
            f"{path}: {len(starts)} window(s) of {spec.length} bars within sessions, too few"
            " for one training and one validation window"
        )
    return train, val


def _observed(prices: dict[str, np.ndarray], volume: np.ndarray) -> np.ndarray:
    """[rows, 4] float64: log return, log(high/low), log(1 + volume), realised volatility."""
    log_close = np.log(prices["close"])
    returns = np.diff(log_close, prepend=np.log(prices["open"][0]))
    return np.stack(
        [
            returns,
            np.log(prices["high"] / prices["low"]),
            np.log1p(volume),
            _rolling_std(returns, REALISED_VOL_BARS),
        ],
        axis=1,
    )


def _rolling_std(x: np.ndarray, bars: int) -> np.ndarray:
    """Population std of the last ``bars`` values up to each row (fewer at the start)."""
    s1 = np.concatenate(([0.0], np.cumsum(x)))
    s2 = np.concatenate(([0.0], np.cumsum(x * x)))
    end = np.arange(1, len(x) + 1)
    begin = np.maximum(end - bars, 0)
    count = end - begin
    mean = (s1[end] - s1[begin]) / count
    return np.sqrt(np.clip((s2[end] - s2[begin]) / count - mean**2, 0.0, None))


def _known(ts: np.ndarray) -> np.ndarray:
    """[rows, 4] float64: sin/cos of the UTC time of day and of the day of week (Monday 0)."""
    day = 2 * np.pi * (ts % _DAY_NS) / _DAY_NS
    week = 2 * np.pi * ((ts // _DAY_NS + 3) % 7) / 7
    return np.stack([np.sin(day), np.cos(day), np.sin(week), np.cos(week)], axis=1)


# --- command line -----------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tft.data", description="Synthetic ES futures bars and their windows.")
    commands = parser.add_subparsers(dest="command", required=True)
    synth_cmd = commands.add_parser("synth", help="write deterministic synthetic bars")
    synth_cmd.add_argument("--out", type=Path, required=True, help="parquet file to write")
    synth_cmd.add_argument("--seed", type=_count(0), default=DEFAULT_SEED)
    synth_cmd.add_argument("--rows", type=_count(1), default=DEFAULT_ROWS)
    info_cmd = commands.add_parser("info", help="rows, time span and window counts of a file")
    info_cmd.add_argument("path", type=Path)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tft.data synth --out PATH [--seed S] [--rows N]`` or ``info PATH``."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "synth":
            if problem := write_problem(args.out):
                raise DataError(f"--out {args.out}: {problem}")
            path = synth(args.out, seed=args.seed, rows=args.rows)
            print(f"wrote {path}: {args.rows} rows, {path.stat().st_size} bytes")
        else:
            split = load(args.path)
            spec = split.train.spec
            print(f"path     {split.path}")
            print(f"rows     {split.n_rows} ({', '.join(split.symbols)})")
            span = np.datetime_as_string(np.array([split.start, split.end]), unit="s")
            print(f"span     {span[0]} .. {span[1]} UTC")
            print(
                f"windows  {len(split.train)} train, {len(split.val)} val (encoder"
                f" {spec.encoder_length}, decoder {spec.decoder_length}, stride {spec.stride})"
            )
    except DataError as exc:
        print(f"tft.data: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"tft.data: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

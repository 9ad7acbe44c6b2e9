"""Deterministic synthetic E-mini S&P 1-minute bars, written as parquet: the default data set.

Bars follow the CME Globex week (17:00 to 16:00 Chicago time, Sunday evening to Friday
afternoon, a one-hour break each day, no weekend bars; Chicago is taken as UTC-5 all year, with
no holidays). Returns are GARCH(1,1) with Student-t shocks scaled by an intraday profile, and
volume follows volatility, so the spread of the next minutes is predictable from the time of day
and recent realised volatility.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = [
    "DEFAULT_FILE",
    "DEFAULT_ROWS",
    "DEFAULT_SEED",
    "TICK",
    "cache_dir",
    "default_parquet",
    "synth",
    "synth_bars",
]

TICK = 0.25
DEFAULT_SEED = 0
DEFAULT_ROWS = 13_800  # ten Globex sessions of 23 hours: two trading weeks
DEFAULT_FILE = "ES_FUT_small.parquet"

_MINUTE_NS = 60 * 10**9
_DAY_NS = 1440 * _MINUTE_NS
_FIRST_OPEN = np.datetime64("2024-06-02T22:00", "ns")  # Sunday 17:00 in Chicago
_CHICAGO_OFFSET_MINUTES = -5 * 60
_SESSION_BARS = 23 * 60
_START_PRICE = 5300.0
_MINUTE_VOL = 2.5e-4
_GARCH = (0.02, 0.08, 0.90)  # omega, alpha, beta: unit unconditional variance
_SHOCK_DOF = 5.0
_BREAK_GAP_VOL = 1.5e-3
_WEEKEND_GAP_VOL = 3.0e-3
_VOLUME_SCALE = 3000.0
_WRITE_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 3,
    "row_group_size": 1 << 16,
    "version": "2.6",
    "use_dictionary": ["symbol"],
    "write_statistics": True,
}


def synth_bars(
    *, seed: int = DEFAULT_SEED, rows: int = DEFAULT_ROWS, symbol: str = "ES"
) -> pa.Table:
    """``rows`` 1-minute bars from ``numpy.random.default_rng(seed)``, starting 2024-06-02."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    rng = np.random.default_rng(seed)
    ts, first_bar = _calendar(rows)
    chicago_minute = (ts // _MINUTE_NS + _CHICAGO_OFFSET_MINUTES) % 1440
    profile = _intraday_profile(chicago_minute)

    shocks = rng.standard_t(_SHOCK_DOF, rows) * np.sqrt((_SHOCK_DOF - 2) / _SHOCK_DOF)
    variance = _garch_variance(shocks)
    sigma = _MINUTE_VOL * profile * np.sqrt(variance)
    after_weekend = first_bar & ((ts // _DAY_NS + 3) % 7 == 6)
    gap_vol = np.where(after_weekend, _WEEKEND_GAP_VOL, _BREAK_GAP_VOL) * first_bar
    gaps = rng.standard_normal(rows) * gap_vol
    gaps[0] = 0.0

    log_close = np.log(_START_PRICE) + np.cumsum(sigma * shocks + gaps)
    log_open = np.concatenate(([np.log(_START_PRICE)], log_close[:-1])) + gaps
    open_, close = _to_tick(np.exp(log_open)), _to_tick(np.exp(log_close))
    bar_ticks = 0.6 * sigma * close / TICK
    up, down = np.floor(np.abs(rng.standard_normal((2, rows))) * bar_ticks) * TICK
    volume = _VOLUME_SCALE * profile**2 * np.sqrt(variance) * rng.lognormal(0.0, 0.4, rows)
    return pa.table(
        {
            "ts": pa.array(ts, pa.timestamp("ns", tz="UTC")),
            "symbol": pa.array([symbol] * rows, pa.string()),
            "open": open_,
            "high": np.maximum(open_, close) + up,
            "low": np.minimum(open_, close) - down,
            "close": close,
            "volume": np.maximum(1, np.rint(volume)).astype(np.int64),
        }
    )


def synth(
    out: str | os.PathLike[str], *, seed: int = DEFAULT_SEED, rows: int = DEFAULT_ROWS
) -> Path:
    """Write :func:`synth_bars` to ``out`` atomically; the same arguments give the same bytes
    (for a given pyarrow version)."""
    path = Path(out)
    _write_atomic(synth_bars(seed=seed, rows=rows), path)
    return path


def cache_dir() -> Path:
    """``$LEAKGATE_CACHE``, else ``$XDG_CACHE_HOME/leakgate``, else ``~/.cache/leakgate``."""
    if explicit := os.environ.get("LEAKGATE_CACHE"):
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "leakgate"


def default_parquet() -> Path:
    """The default synthetic file (704 training, 176 validation windows), made on first use."""
    path = cache_dir() / DEFAULT_FILE
    if not path.is_file():
        synth(path)
    return path


def _calendar(rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Bar timestamps (int64 ns, UTC) of consecutive Globex sessions, and first-bar flags."""
    sessions = np.arange(-(-rows // _SESSION_BARS))
    week, day = np.divmod(sessions, 5)
    opens = _FIRST_OPEN.astype(np.int64) + (7 * week + day) * _DAY_NS
    ts = (opens[:, None] + np.arange(_SESSION_BARS) * _MINUTE_NS).ravel()[:rows]
    return ts, np.arange(rows) % _SESSION_BARS == 0


def _intraday_profile(minute: np.ndarray) -> np.ndarray:
    """Relative volatility by minute of the Chicago day: quiet overnight, a bump at the European
    open, a U over the regular session (08:30-15:00) and a lift at the evening reopen."""
    m = minute.astype(np.float64)
    europe = 0.35 * np.exp(-(((m - 120) / 60) ** 2))
    regular = (m >= 510) & (m < 900)
    since_open = np.clip(m - 510, 0, None)
    to_close = np.clip(900 - m, 0, None)
    u_shape = (
        0.55
        + 0.7 * ((m - 705) / 195) ** 2
        + np.exp(-since_open / 20)
        + 0.3 * np.exp(-to_close / 15)
    )
    evening_open = 0.3 * np.exp(-np.clip(m - 1020, 0, None) / 30) * (m >= 1020)
    return 0.45 + europe + np.where(regular, u_shape, 0.0) + evening_open


def _garch_variance(shocks: np.ndarray) -> np.ndarray:
    """Conditional variances h of GARCH(1,1) driven by unit-variance ``shocks``."""
    omega, alpha, beta = _GARCH
    h = np.empty(len(shocks))
    current = 1.0
    for t, z in enumerate(shocks.tolist()):
        h[t] = current
        current = omega + (alpha * z * z + beta) * current
    return h


def _to_tick(price: np.ndarray) -> np.ndarray:
    return np.round(price / TICK) * TICK


def _write_atomic(table: pa.Table, path: Path) -> None:
    """Write through a temporary file in the same folder and rename, so no half file is left."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as f:
            pq.write_table(table, f, **_WRITE_OPTIONS)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import default_collate

from tft import data
from tft.data import (
    DataError,
    WindowDataset,
    WindowSpec,
    cache_dir,
    default_parquet,
    load,
    main,
    synth,
    synth_bars,
)

REPO = Path(__file__).resolve().parents[1]
MINUTE_NS = 60 * 10**9


@pytest.fixture(scope="module")
def default_file(tmp_path_factory):
    return synth(tmp_path_factory.mktemp("default") / "ES_FUT_small.parquet")


@pytest.fixture(scope="module")
def split(default_file):
    return load(default_file)


@pytest.fixture(scope="module")
def bars(default_file):
    """The default file as numpy arrays: UTC timestamps (int64 ns), OHLC, volume, log returns."""
    table = pq.read_table(default_file)
    out = {name: table[name].to_numpy() for name in ("open", "high", "low", "close", "volume")}
    out["ts"] = table["ts"].cast(pa.int64()).to_numpy()
    out["ret"] = np.diff(np.log(out["close"]), prepend=np.log(out["open"][0]))
    return out


@pytest.fixture(scope="module")
def short_file(tmp_path_factory):
    """Three sessions cut short: 1380 + 1380 + 240 bars."""
    return synth(tmp_path_factory.mktemp("short") / "short.parquet", rows=3000, seed=7)


def utc_minute(ts):
    return (ts // MINUTE_NS) % 1440


# --- synthetic file ---------------------------------------------------------------------------


def test_same_seed_same_bytes_other_seed_other_bytes(default_file, tmp_path):
    again = synth(tmp_path / "again.parquet")
    other = synth(tmp_path / "other.parquet", seed=1)
    assert again.read_bytes() == default_file.read_bytes()
    assert other.read_bytes() != default_file.read_bytes()
    assert pq.read_table(other)["ts"] == pq.read_table(default_file)["ts"]


def test_schema_and_no_pandas_metadata(default_file):
    schema = pq.read_schema(default_file)
    assert pa.types.is_timestamp(schema.field("ts").type)
    assert schema.field("ts").type.tz == "UTC"
    assert schema.field("symbol").type == pa.string()
    for name in ("open", "high", "low", "close"):
        assert schema.field(name).type == pa.float64()
    assert schema.field("volume").type == pa.int64()
    assert b"pandas" not in (schema.metadata or {})
    assert pq.read_table(default_file)["symbol"].unique().to_pylist() == ["ES"]


def test_ohlc_invariants_and_ticks(bars):
    o, h, lo, c, v = (bars[k] for k in ("open", "high", "low", "close", "volume"))
    assert (h >= np.maximum(o, c)).all()
    assert (lo <= np.minimum(o, c)).all()
    assert (lo > 0).all()
    for prices in (o, h, lo, c):
        assert (np.mod(prices, 0.25) == 0).all()
    assert v.dtype == np.int64
    assert (v > 0).all()
    assert (h > lo).mean() > 0.5


def test_globex_sessions(bars):
    ts = bars["ts"]
    assert len(ts) == data.DEFAULT_ROWS
    weekday = (ts // (1440 * MINUTE_NS) + 3) % 7  # Monday 0
    hour = utc_minute(ts) // 60
    assert not (weekday == 5).any(), "Saturday bars"
    assert (hour[weekday == 6] >= 22).all(), "Sunday bars before the 17:00 Chicago open"
    assert (hour[weekday == 4] < 21).all(), "Friday bars after the 16:00 Chicago close"
    assert not (hour == 21).any(), "bars in the daily maintenance break"
    gaps = np.diff(ts)
    assert set(np.unique(gaps).tolist()) == {MINUTE_NS, 61 * MINUTE_NS, (49 * 60 + 1) * MINUTE_NS}
    assert (gaps > 30 * MINUTE_NS).sum() == 9  # ten sessions


def test_intraday_u_shape(bars):
    minute = utc_minute(bars["ts"])
    abs_ret, volume = np.abs(bars["ret"]), bars["volume"]

    def mean_between(values, start, end):
        return values[(minute >= start) & (minute < end)].mean()

    hours = {"open": (810, 870), "midday": (990, 1050), "close": (1140, 1200), "night": (240, 360)}
    vol = {k: mean_between(abs_ret, *span) for k, span in hours.items()}
    size = {k: mean_between(volume, *span) for k, span in hours.items()}
    for stats in (vol, size):
        assert stats["open"] > 1.2 * stats["midday"]
        assert stats["close"] > 1.2 * stats["midday"]
        assert stats["midday"] > 1.5 * stats["night"]


def test_volatility_clusters_beyond_time_of_day(bars):
    abs_ret = np.abs(bars["ret"])
    bucket = utc_minute(bars["ts"]) // 30
    seasonal = np.bincount(bucket, abs_ret) / np.maximum(np.bincount(bucket), 1)
    x = abs_ret / seasonal[bucket]
    x = x - x.mean()
    acf = {lag: (x[:-lag] * x[lag:]).mean() / x.var() for lag in (1, 10)}
    assert acf[1] > 0.1
    assert acf[10] > 0.05


def test_recent_realised_vol_predicts_next_minutes(split):
    observed = split.train.series.observed.numpy()
    realised, ret = observed[:-10, 3], observed[:, 0]
    next_abs = np.abs(np.lib.stride_tricks.sliding_window_view(ret[1:], 10)).mean(axis=1)
    assert np.corrcoef(realised, next_abs)[0, 1] > 0.3


# --- windows and split ------------------------------------------------------------------------


def test_default_file_gives_704_and_176_windows(split, default_file):
    assert (len(split.train), len(split.val)) == (704, 176)
    assert split.n_rows == data.DEFAULT_ROWS
    assert split.path == default_file
    assert split.symbols == ("ES",)
    assert split.start == np.datetime64("2024-06-02T22:00", "ns")
    assert split.train.spec == WindowSpec(60, 10, 15)


def last_target_time(dataset, i):
    return dataset.window_times(i)[-1]


def first_target_time(dataset, i):
    return dataset.window_times(i)[dataset.spec.encoder_length]


def test_no_validation_target_in_training_range(split):
    last_train = max(last_target_time(split.train, i) for i in range(len(split.train)))
    first_val = min(first_target_time(split.val, i) for i in range(len(split.val)))
    assert first_val > last_train


@settings(max_examples=30, deadline=None)
@given(
    encoder=st.integers(1, 240),
    decoder=st.integers(1, 60),
    stride=st.integers(1, 90),
)
def test_split_rule_for_any_spec(short_file, encoder, decoder, stride):
    spec = WindowSpec(encoder, decoder, stride)
    result = load(short_file, spec)
    train, val = result.train, result.val
    assert train.spec == val.spec == spec
    for dataset in (train, val):
        times = np.stack([dataset.window_times(i) for i in range(len(dataset))])
        # every window lies inside one session: consecutive minutes
        assert (np.diff(times.astype(np.int64), axis=1) == MINUTE_NS).all()
    assert first_target_time(val, 0) > last_target_time(train, len(train) - 1)
    assert (np.diff(train.starts) > 0).all() and (np.diff(val.starts) > 0).all()
    if stride >= decoder:  # nothing falls in the gap: an exact 80/20 split
        assert len(train) == (len(train) + len(val)) * 4 // 5


def test_windows_in_the_gap_are_dropped(short_file):
    # sessions of 1380, 1380 and 240 bars hold 328 + 328 + 43 windows of 70 bars every 4 bars
    result = load(short_file, WindowSpec(60, 10, 4))
    assert len(result.train) == 699 * 4 // 5
    # the next two windows would predict bars that the last training window already targets
    assert len(result.val) == 699 - len(result.train) - 2
    assert result.val.starts[0] - result.train.starts[-1] == 12
    assert first_target_time(result.val, 0) > last_target_time(result.train, len(result.train) - 1)


def perturbed_copy(default_file, path, rows):
    table = pq.read_table(default_file)
    scale = np.ones(table.num_rows)
    scale[rows] = 1.5
    for name in ("open", "high", "low", "close", "volume"):
        values = table[name].to_numpy() * scale
        column = pa.array(values.astype(table[name].type.to_pandas_dtype()))
        table = table.set_column(table.schema.get_field_index(name), name, column)
    pq.write_table(table, path)
    return path


def test_normalisation_is_fitted_on_training_rows_only(split, default_file, tmp_path):
    fitted = split.normalisation
    assert fitted.rows == int(split.train.starts[-1]) + split.train.spec.length
    assert fitted.names == ("log_return", "range", "log_volume", "realised_vol")

    val_rows = np.arange(fitted.rows, split.n_rows)
    changed_val = load(perturbed_copy(default_file, tmp_path / "val.parquet", val_rows))
    assert changed_val.normalisation == fitted
    assert torch.equal(changed_val.train[703]["observed"], split.train[703]["observed"])
    assert not torch.equal(changed_val.val[175]["observed"], split.val[175]["observed"])

    changed_train = load(
        perturbed_copy(default_file, tmp_path / "train.parquet", [fitted.rows - 1])
    )
    assert changed_train.normalisation.mean != fitted.mean


def test_window_shapes_and_dtypes(split):
    assert isinstance(split.train, WindowDataset)
    assert (split.train.n_observed, split.train.n_known) == (4, 4)
    assert split.train.static_cardinalities == (1,)
    item = split.val[0]
    assert set(item) == {"static", "observed", "known", "target"}
    expected = {
        "static": ((1,), torch.int64),
        "observed": ((60, 4), torch.float32),
        "known": ((70, 4), torch.float32),
        "target": ((10,), torch.float32),
    }
    for key, (shape, dtype) in expected.items():
        assert (tuple(item[key].shape), item[key].dtype) == (shape, dtype), key
    batch = default_collate([split.train[i] for i in range(4)])
    assert batch["observed"].shape == (4, 60, 4)
    assert batch["static"].shape == (4, 1)
    with pytest.raises(IndexError):
        split.train[len(split.train)]


def test_windows_are_views_of_the_series(split):
    series = split.train.series
    assert split.val.series is series
    for dataset in (split.train, split.val):
        for i in (0, len(dataset) - 1):
            item = dataset[i]
            for key in ("observed", "known", "target"):
                storage = getattr(series, key).untyped_storage().data_ptr()
                assert item[key].untyped_storage().data_ptr() == storage, key


def test_window_values_match_the_file(split, bars):
    norm = split.normalisation
    dataset = split.val
    i = 17
    start = int(dataset.starts[i])
    enc, dec = dataset.spec.encoder_length, dataset.spec.decoder_length
    ret = bars["ret"][start : start + enc + dec]
    item = dataset[i]
    expected_obs = (ret[:enc] - norm.mean[0]) / norm.std[0]
    expected_target = (ret[enc:] - norm.mean[0]) / norm.std[0]
    np.testing.assert_allclose(item["observed"][:, 0].numpy(), expected_obs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(item["target"].numpy(), expected_target, rtol=1e-5, atol=1e-5)

    times = dataset.window_times(i).astype(np.int64)
    day = 2 * np.pi * (times % (1440 * MINUTE_NS)) / (1440 * MINUTE_NS)
    np.testing.assert_allclose(item["known"][:, 0].numpy(), np.sin(day), atol=1e-6)
    np.testing.assert_allclose(item["known"][:, 1].numpy(), np.cos(day), atol=1e-6)
    weekday = (times // (1440 * MINUTE_NS) + 3) % 7
    np.testing.assert_allclose(
        item["known"][:, 2].numpy(), np.sin(2 * np.pi * weekday / 7), atol=1e-6
    )


def test_window_spec_rejects_bad_geometry():
    for bad in ({"encoder_length": 0}, {"decoder_length": -1}, {"stride": 1.5}, {"stride": True}):
        with pytest.raises(ValueError, match="WindowSpec"):
            WindowSpec(**bad)
    assert WindowSpec().length == 70


# --- default file and cache -------------------------------------------------------------------


def test_default_parquet_is_made_once_in_the_cache(monkeypatch, tmp_path, default_file):
    monkeypatch.setenv("LEAKGATE_CACHE", str(tmp_path / "cache"))
    path = default_parquet()
    assert path == tmp_path / "cache" / "ES_FUT_small.parquet"
    assert path.read_bytes() == default_file.read_bytes()
    inode = path.stat().st_ino
    assert default_parquet().stat().st_ino == inode
    assert sorted(p.name for p in path.parent.iterdir()) == ["ES_FUT_small.parquet"]


def test_cache_dir_fallbacks(monkeypatch, tmp_path):
    monkeypatch.delenv("LEAKGATE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "leakgate"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "leakgate"


def test_interrupted_write_leaves_no_file(monkeypatch, tmp_path):
    def crash(table, where, **options):
        where.write(b"PAR1 half a file")
        raise KeyboardInterrupt

    monkeypatch.setenv("LEAKGATE_CACHE", str(tmp_path))
    monkeypatch.setattr(pq, "write_table", crash)
    with pytest.raises(KeyboardInterrupt):
        default_parquet()
    assert list(tmp_path.iterdir()) == []


def test_synthetic_names_stay_importable_from_data_and_the_package():
    import tft
    from tft import synthetic

    for name in ("synth", "synth_bars", "default_parquet", "cache_dir", "DEFAULT_ROWS"):
        assert getattr(data, name) is getattr(synthetic, name)
    assert tft.synth is synthetic.synth  # the function, not a module of that name


# --- bad input --------------------------------------------------------------------------------


def replace_column(table, name, values):
    return table.set_column(table.schema.get_field_index(name), name, values)


def with_value(table, name, row, value):
    values = table[name].to_numpy().astype(np.float64)
    values[row] = value
    return replace_column(table, name, pa.array(values))


def swap_first_rows(table):
    ts = table["ts"].to_pylist()
    ts[0], ts[1] = ts[1], ts[0]
    return replace_column(table, "ts", pa.array(ts, table["ts"].type))


BAD_TABLES = {
    "missing column": (lambda t: t.drop_columns(["volume"]), "missing column"),
    "mistyped price": (
        lambda t: replace_column(t, "close", pc.cast(t["close"], pa.string())),
        "type",
    ),
    "mistyped ts": (lambda t: replace_column(t, "ts", pc.cast(t["ts"], pa.int64())), "timestamp"),
    "NaN price": (lambda t: with_value(t, "close", 5, np.nan), "NaN"),
    "inf volume": (lambda t: with_value(t, "volume", 9, np.inf), "infinite"),
    "null price": (
        lambda t: replace_column(t, "open", pa.array([None, *t["open"].to_pylist()[1:]])),
        "missing values",
    ),
    "zero price": (lambda t: with_value(t, "low", 3, 0.0), "non-positive"),
    "duplicate ts": (
        lambda t: replace_column(t, "ts", pa.array([t["ts"][0], *t["ts"][:-1]], t["ts"].type)),
        "strictly increasing",
    ),
    "ts going back": (swap_first_rows, "strictly increasing"),
    "two symbols": (
        lambda t: replace_column(t, "symbol", pa.array(["ES"] * 100 + ["NQ"] * 100)),
        "one per file",
    ),
    "shorter than a window": (lambda t: t.slice(0, 69), "fewer than one window"),
    "one window only": (lambda t: t.slice(0, 70), "too few"),
}


@pytest.fixture(scope="module")
def small_table():
    return synth_bars(rows=200)


@pytest.mark.parametrize("case", list(BAD_TABLES))
def test_bad_table_raises_data_error_naming_the_file(case, small_table, tmp_path):
    make, problem = BAD_TABLES[case]
    path = tmp_path / f"bad_{case.replace(' ', '_')}.parquet"
    pq.write_table(make(small_table), path)
    with pytest.raises(DataError, match=problem) as info:
        load(path)
    assert path.name in str(info.value)


def test_missing_file_and_non_parquet_raise_data_error(tmp_path):
    with pytest.raises(DataError, match="no such file") as info:
        load(tmp_path / "absent.parquet")
    assert "absent.parquet" in str(info.value)
    text = tmp_path / "bars.csv"
    text.write_text("ts,open,high,low,close,volume\n")
    with pytest.raises(DataError, match="not a parquet file") as info:
        load(text)
    assert "bars.csv" in str(info.value)


def test_extra_columns_are_not_read(small_table, tmp_path):
    path = tmp_path / "extra.parquet"
    pq.write_table(small_table.append_column("note", pa.array([b"x"] * 200, pa.binary())), path)
    assert len(load(path, WindowSpec(20, 5, 10)).train) > 0


# --- command line -----------------------------------------------------------------------------


def test_cli_synth_and_info(tmp_path, capsys, default_file):
    out = tmp_path / "sub" / "bars.parquet"
    assert main(["synth", "--out", str(out), "--rows", "500", "--seed", "3"]) == 0
    assert pq.read_metadata(out).num_rows == 500
    assert "500 rows" in capsys.readouterr().out
    assert main(["info", str(default_file)]) == 0
    printed = capsys.readouterr().out
    assert "13800" in printed
    assert "704 train, 176 val" in printed
    assert "2024-06-02T22:00:00" in printed


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["bogus"],
        ["info"],
        ["synth"],
        ["synth", "--out", "x.parquet", "--rows", "0"],
        ["synth", "--out", "x.parquet", "--seed", "-1"],
        ["synth", "--out", "x.parquet", "--rows", "many"],
    ],
)
def test_cli_bad_arguments_exit_2_with_one_line(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("tft.data")


def test_cli_data_error_exits_2_with_one_line(tmp_path, capsys):
    assert main(["info", str(tmp_path / "absent.parquet")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "absent.parquet" in err


def test_module_entry_point_has_no_traceback(tmp_path):
    bad = tmp_path / "not_bars.parquet"
    bad.write_bytes(b"nope")
    done = subprocess.run(
        [sys.executable, "-m", "tft.data", "info", str(bad)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert "not_bars.parquet" in done.stderr
    assert "Traceback" not in done.stderr

"""Sizes: decimal and binary units read exactly, absurd sizes refused, binary labels printed."""

import pytest

from harness._core.units import (
    MAX_BYTES,
    echo_size,
    format_mib,
    format_rate,
    format_size,
    parse_size,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (4096, 4096),
        ("4096", 4096),
        ("50MB", 50_000_000),
        ("50mb", 50_000_000),
        ("512KiB", 512 * 1024),
        ("4 GB", 4_000_000_000),
        ("4GiB", 4 * 2**30),
        ("1.5mib", 3 * 2**19),
        ("0.1kB", 100),
        ("1.1GB", 1_100_000_000),
        ("9007199254740993", 2**53 + 1),  # a float would read 2**53
        ("3.000000000000000001TiB", 3 * 2**40),
        ("1024PiB", MAX_BYTES),
        ("0.0005kB", 1),  # half a byte rounds up
        ("0", 0),
    ],
)
def test_parse_size_reads_decimal_and_binary_units_exactly(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "bad",
    [
        "abc",
        "-5MB",
        -1,
        "5 XB",
        "",
        "MB",
        "1e9",
        "\uff11\uff12MB",  # full-width digits
        True,
        1.5,
        None,
        "9" * 300,
        "9" * 400 + "GB",
        "1" + "0" * 30 + "TB",
        "1024.1PiB",
        MAX_BYTES + 1,
        10**300,
    ],
    ids=lambda v: repr(v)[:20],
)
def test_parse_size_refuses_with_a_value_error_naming_the_option(bad):
    with pytest.raises(ValueError, match="capacity"):
        parse_size(bad, what="capacity")


def test_format_size_prints_binary_labels_in_the_largest_unit():
    assert format_size(4 * 10**6) == "3.8MiB"
    assert format_size(2**20) == "1.0MiB"
    assert format_size(2**20 - 1) == "1.0MiB"  # not 1024.0KiB
    assert format_size(960) == "960B"
    assert format_size(40 * 1024) == "40.0KiB"
    assert format_size(8 * 2**20, signed=True) == "+8.0MiB"
    assert format_size(3 * 2**29) == "1.5GiB"
    assert format_size(-512, signed=True) == "-512B"
    assert format_size(None) == "n/a" and format_size(float("nan")) == "n/a"


def test_format_mib_keeps_one_unit_for_columns():
    assert format_mib(1611 * 2**20) == "1611.0MiB"
    assert format_mib(-39 * 2**20, signed=True) == "-39.0MiB"
    assert format_mib(None) == "n/a"


def test_rates_and_thresholds():
    assert format_rate(2**20) == "+1.0MiB/batch" and format_rate(615.4) == "+615B/batch"
    assert format_rate(None) == "n/a"
    assert echo_size("50MB", parse_size("50MB")) == "50MB (47.7MiB)"
    assert echo_size("20MiB", 20 * 2**20) == "20MiB" and echo_size("512B", 512) == "512B"

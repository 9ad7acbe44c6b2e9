import pytest

from harness.units import format_mb, format_size, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (4096, 4096),
        ("4096", 4096),
        ("50MB", 50_000_000),
        ("512KiB", 512 * 1024),
        ("4 GB", 4_000_000_000),
        ("4GiB", 4 * 2**30),
        ("1.5mib", 3 * 2**19),
        ("0", 0),
    ],
)
def test_parse_size_accepts(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["abc", "-5MB", -1, "5 XB", "", "MB", True, 1.5, None])
def test_parse_size_rejects_with_named_error(bad):
    with pytest.raises(ValueError, match="capacity"):
        parse_size(bad, what="capacity")


def test_format_mb():
    assert format_mb(1611 * 2**20) == "1611.0MB"
    assert format_mb(-39 * 2**20, signed=True) == "-39.0MB"
    assert format_mb(None) == "n/a"


def test_format_size_picks_the_unit():
    assert format_size(40 * 1024) == "40.0KB"
    assert format_size(8 * 2**20, signed=True) == "+8.0MB"
    assert format_size(3 * 2**29) == "1.5GB"
    assert format_size(-512, signed=True) == "-512B"
    assert format_size(None) == "n/a"

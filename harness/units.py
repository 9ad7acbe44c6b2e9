"""Byte sizes: parse ``"50MB"``, ``"512KiB"``, ``"4 GB"`` or ints; format bytes for people."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: int | str, *, what: str = "size") -> int:
    """Return ``value`` in bytes. SI units are powers of 1000 (MB), IEC of 1024 (MiB).

    Raises ``ValueError`` naming ``what`` for negatives, booleans and unparsable strings.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{what}: expected bytes as an int or a string like '50MB', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{what}: must not be negative, got {value}")
        return value
    match = _SIZE.match(value)
    unit = match and match.group(2).lower()
    if not match or unit not in _UNITS:
        raise ValueError(
            f"{what}: cannot read {value!r} as a size (examples: 4096, '50MB', '512KiB', '4 GiB')"
        )
    return round(float(match.group(1)) * _UNITS[unit])


def format_mb(nbytes: float | None, *, signed: bool = False) -> str:
    """Format bytes as MiB with one decimal, the unit the report tables use ('n/a' for None)."""
    if nbytes is None:
        return "n/a"
    return f"{nbytes / 2**20:{'+' if signed else ''}.1f}MB"


def format_size(nbytes: float | None, *, signed: bool = False) -> str:
    """Format bytes in the largest binary unit that keeps the number >= 1 (``40.0KB``,
    ``1.5GB``), for messages where thresholds range from bytes to gigabytes."""
    if nbytes is None:
        return "n/a"
    sign = "+" if signed else ""
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:{sign}.1f}{unit}"
    return f"{nbytes:{sign}.0f}B"

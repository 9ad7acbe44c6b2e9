"""Byte sizes, read and written: :func:`parse_size` reads ints and strings such as ``"50MB"``,
``"512KiB"`` or ``"4 GB"`` exactly (decimal units are powers of 1000, binary ones of 1024, with
no float on the way) and refuses sizes above :data:`MAX_BYTES`; sizes are printed with binary
units and labels (``3.8MiB``), as ``torch.cuda.memory_summary`` and ``nvidia-smi`` print them,
and a threshold is echoed as the user wrote it (:func:`echo_size`).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from harness._core.errors import BadArgument

MAX_BYTES = 2**60
"""The largest size accepted (1 EiB): anything above is a typo, not a memory budget."""
_MAX_CHARS = 64
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pib": 2**50,
}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)", re.ASCII | re.IGNORECASE)
_BINARY = (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20))


def parse_size(value: int | str, *, what: str = "size") -> int:
    """Return ``value`` in bytes, rounded to the nearest byte (halves up).

    Raises :class:`~harness._core.errors.BadArgument` (a ``ValueError`` and a ``TypeError``)
    whose ``field`` is ``what`` for negatives, booleans, floats, unparsable strings and sizes
    above :data:`MAX_BYTES`.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        problem = f"expected bytes as an int or a string like '50MB', got {value!r}"
        raise BadArgument(problem, field=what)
    if isinstance(value, int):
        if value < 0:
            raise BadArgument(f"must not be negative, got {value}", field=what)
        shown = value if value.bit_length() <= 128 else f"a {value.bit_length()}-bit number"
        return _bounded(value, shown, what)
    shown = value if len(value) <= 40 else value[:37] + "..."
    if len(value) > _MAX_CHARS:
        raise BadArgument(f"{shown!r} is too long to be a size", field=what)
    match = _SIZE.fullmatch(value.strip())
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        examples = "examples: 4096, '50MB', '512KiB', '4 GiB'"
        raise BadArgument(f"cannot read {shown!r} as a size ({examples})", field=what)
    exact = Fraction(match.group(1)) * _UNITS[unit]
    return _bounded(math.floor(exact + Fraction(1, 2)), shown, what)


def _bounded(nbytes: int, shown: object, what: str) -> int:
    if nbytes > MAX_BYTES:
        raise BadArgument(f"{shown!r} is more than {format_size(MAX_BYTES)}", field=what)
    return nbytes


def format_size(nbytes: float | None, *, signed: bool = False) -> str:
    """Bytes in the smallest binary unit that shows them under 1024 (``960B``, ``40.0KiB``,
    ``976.6KiB`` for 1 MB, ``3.8MiB``, ``1.5GiB``); ``n/a`` for None or a non-finite number."""
    if nbytes is None or not math.isfinite(nbytes):
        return "n/a"
    sign = "+" if signed else ""
    if round(abs(nbytes)) < 2**10:
        return f"{nbytes:{sign}.0f}B"
    *smaller, (unit, scale) = (("KiB", 2**10), *reversed(_BINARY))
    for name, size in smaller:
        if round(abs(nbytes) / size, 1) < 2**10:
            unit, scale = name, size
            break
    return f"{nbytes / scale:{sign}.1f}{unit}"


def format_mib(nbytes: float | None, *, signed: bool = False) -> str:
    """Bytes as MiB with one decimal (``1611.0MiB``), for columns of one unit; ``n/a`` for
    None or a non-finite number."""
    if nbytes is None or not math.isfinite(nbytes):
        return "n/a"
    return f"{nbytes / 2**20:{'+' if signed else ''}.1f}MiB"


def format_rate(slope: float | None) -> str:
    """Bytes per batch in their own unit: ``+1.0MiB/batch``, ``+615B/batch``."""
    text = format_size(slope, signed=True)
    return text if text == "n/a" else f"{text}/batch"


def echo_size(written: str, nbytes: int | None) -> str:
    """A threshold as the user wrote it, with its binary figure when that says something more:
    ``50MB (47.7MiB)``, but ``20MiB`` and ``512B`` alone."""
    if nbytes is None or nbytes < 2**10 or written.lower().endswith("ib"):
        return written
    return f"{written} ({format_size(nbytes)})"

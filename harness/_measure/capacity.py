"""An emulated capacity that a probe cannot make its device enforce, checked at checkpoints.

On the CPU it counts the process's resident memory (``rss``), the interpreter and libraries
included (about 230 MB with torch imported), and its ``peak`` since the previous reading. A
checkpoint over it is recorded with a note, then raises, as each batch would fail on a device
that small; ``OOM`` events do not raise, as they report one being handled. When the previous
checkpoint was over already, its level is where this one's peak window started, so only the
level counts: memory freed after an OOM ends the failures. (On CUDA the caching allocator
enforces the capacity itself: see :meth:`harness._measure.probes.Probe.limit`.)
"""

from __future__ import annotations

from collections.abc import Mapping

from harness._core.units import format_mib


class CheckedCapacity:
    """``limit`` bytes of ``metric`` (and of ``peak``) on the device a probe named ``device``
    reads, checked at each checkpoint."""

    def __init__(self, limit: int, metric: str, device: str) -> None:
        self.limit = limit
        self.metric = metric
        self.device = device
        self._over = False

    def exceeded(
        self, label: str, metrics: Mapping[str, int | None], may_raise: bool
    ) -> str | None:
        """The message to raise where a checkpoint's readings exceed the capacity (None where
        they do not, or where ``may_raise`` is false)."""
        level = metrics.get(self.metric)
        peak = metrics.get("peak")
        started_over, self._over = self._over, level is not None and level > self.limit
        used = max(
            (v for v in (level, None if started_over else peak) if v is not None), default=None
        )
        if not may_raise or used is None or used <= self.limit:
            return None
        return (
            f"emulated capacity {format_mib(self.limit)} exceeded at {label!r}: "
            f"{format_mib(used)} on {self.device}"
        )

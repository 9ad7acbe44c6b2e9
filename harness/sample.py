"""One reading of device memory at a named checkpoint."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Sample:
    """Memory at one checkpoint.

    ``metrics`` maps a metric name to bytes, or to ``None`` where the probe cannot measure it.
    CUDA probes report ``allocated``, ``reserved``, ``peak`` (since the previous checkpoint),
    ``driver_used`` and ``device_used``; the CPU probe reports ``allocated`` (malloc's bytes in
    use), ``rss`` and ``peak``. ``note`` carries an event's text, such as an OOM message.
    """

    label: str
    phase: str | None = None
    epoch: int | None = None
    batch: int | None = None
    time: float = 0.0
    metrics: Mapping[str, int | None] = field(default_factory=dict)
    collected: bool = False
    note: str | None = None

    def get(self, metric: str) -> int | None:
        """Bytes of ``metric``, or ``None`` when it was not measured."""
        return self.metrics.get(metric)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (one timeline line)."""
        data = asdict(self)
        data["metrics"] = dict(self.metrics)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sample:
        """Inverse of :meth:`to_dict`; unknown keys are ignored so newer timelines still load."""
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        if not isinstance(known.get("label"), str):
            raise ValueError(f"sample without a label: {dict(data)!r}")
        known["metrics"] = dict(known.get("metrics") or {})
        return cls(**known)

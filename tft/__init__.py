"""A compact Temporal Fusion Transformer, its parquet data and trainer (the reference workload).

``tft`` never imports ``harness``: the trainer reports checkpoints to plain callbacks.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "DataError": "tft.data",
    "Split": "tft.data",
    "WindowDataset": "tft.data",
    "WindowSpec": "tft.data",
    "default_parquet": "tft.synthetic",
    "load": "tft.data",
    "synth": "tft.synthetic",
    "TFTConfig": "tft.model",
    "TemporalFusionTransformer": "tft.model",
    "quantile_loss": "tft.model",
    "q_risk": "tft.model",
    "TrainConfig": "tft.config",
    "Trainer": "tft.trainer",
    "TrainingOOM": "tft.trainer",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tft' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = list(_EXPORTS)

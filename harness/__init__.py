"""leakgate's harness: record device memory at named checkpoints and judge the timeline.

Names are imported lazily so that loading the pytest plugin does not import torch.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import Any

try:
    __version__ = metadata.version("leakgate")
except metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

_EXPORTS = {
    "LeakgateError": "harness.errors",
    "BadInput": "harness.errors",
    "UnwritableReport": "harness.errors",
    "MemoryCheckFailed": "harness.errors",
    "parse_size": "harness.units",
    "Sample": "harness.sample",
    "judge": "harness.rules",
    "register_rule": "harness.rules",
    "Context": "harness.rules",
    "Group": "harness.rules",
    "Rules": "harness.verdict",
    "Verdict": "harness.verdict",
    "Finding": "harness.verdict",
    "Evidence": "harness.verdict",
    "PhaseStats": "harness.verdict",
    "Check": "harness.verdict",
    "Kind": "harness.verdict",
    "Status": "harness.verdict",
    "Outcome": "harness.verdict",
    "finish_run": "harness.finish",
    "Probe": "harness.probes",
    "CpuProbe": "harness.probes",
    "CudaProbe": "harness.probes",
    "Recorder": "harness.recorder",
    "DeviceOutOfMemory": "harness.recorder",
    "Timeline": "harness.timeline",
    "read_timeline": "harness.timeline",
    "Run": "harness.report",
    "render_report": "harness.report",
    "save_run": "harness.artifacts",
    "write_index": "harness.artifacts",
    "load_run_document": "harness.artifacts",
    "compare_runs": "harness.artifacts",
    "Holder": "harness.attribution",
    "Snapshot": "harness.attribution",
    "PhaseAttribution": "harness.attribution",
    "live_tensors": "harness.attribution",
    "attribute": "harness.attribution",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["__version__", *_EXPORTS]

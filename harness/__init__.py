"""leakgate's harness: record device memory at named checkpoints and judge the timeline.

Names are imported lazily so that loading the pytest plugin does not import torch; a type
checker sees them through the imports under ``TYPE_CHECKING``, which name the same modules as
the table (the lazy ``__getattr__`` is hidden from them, so an unknown name is a type error).
No module of the harness imports this package: each imports the module it needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from harness.version import __version__

if TYPE_CHECKING:
    from harness.artifacts import (
        compare_runs as compare_runs,
    )
    from harness.artifacts import (
        load_run_document as load_run_document,
    )
    from harness.artifacts import (
        save_run as save_run,
    )
    from harness.artifacts import (
        write_index as write_index,
    )
    from harness.attribution import (
        Holder as Holder,
    )
    from harness.attribution import (
        PhaseAttribution as PhaseAttribution,
    )
    from harness.attribution import (
        Snapshot as Snapshot,
    )
    from harness.attribution import (
        attribute as attribute,
    )
    from harness.attribution import (
        live_tensors as live_tensors,
    )
    from harness.errors import (
        BadInput as BadInput,
    )
    from harness.errors import (
        LeakgateError as LeakgateError,
    )
    from harness.errors import (
        UnwritableReport as UnwritableReport,
    )
    from harness.finish import MemoryCheckFailed as MemoryCheckFailed
    from harness.finish import finish_run as finish_run
    from harness.options import (
        Rules as Rules,
    )
    from harness.probes import CpuProbe as CpuProbe
    from harness.probes import CudaProbe as CudaProbe
    from harness.probes import Probe as Probe
    from harness.recorder import DeviceOutOfMemory as DeviceOutOfMemory
    from harness.recorder import Recorder as Recorder
    from harness.report import Run as Run
    from harness.report import render_report as render_report
    from harness.rules import (
        Context as Context,
    )
    from harness.rules import (
        Group as Group,
    )
    from harness.rules import (
        judge as judge,
    )
    from harness.rules import (
        register_rule as register_rule,
    )
    from harness.sample import Sample as Sample
    from harness.timeline import Timeline as Timeline
    from harness.timeline import read_timeline as read_timeline
    from harness.units import parse_size as parse_size
    from harness.verdict import (
        Check as Check,
    )
    from harness.verdict import (
        Evidence as Evidence,
    )
    from harness.verdict import (
        Finding as Finding,
    )
    from harness.verdict import (
        Kind as Kind,
    )
    from harness.verdict import (
        Outcome as Outcome,
    )
    from harness.verdict import (
        PhaseStats as PhaseStats,
    )
    from harness.verdict import (
        Status as Status,
    )
    from harness.verdict import (
        Verdict as Verdict,
    )

_EXPORTS = {
    "LeakgateError": "harness.errors",
    "BadInput": "harness.errors",
    "UnwritableReport": "harness.errors",
    "MemoryCheckFailed": "harness.finish",
    "parse_size": "harness.units",
    "Sample": "harness.sample",
    "judge": "harness.rules",
    "register_rule": "harness.rules",
    "Context": "harness.rules",
    "Group": "harness.rules",
    "Rules": "harness.options",
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


if not TYPE_CHECKING:  # hidden from type checkers, so that ``harness.NoSuchName`` is an error

    def __getattr__(name: str) -> Any:
        module = _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module 'harness' has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)


__all__ = ["__version__", *_EXPORTS]

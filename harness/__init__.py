"""leakgate's harness: record device memory at named checkpoints and judge the timeline.

Names are imported lazily so that loading the pytest plugin does not import torch; a type
checker sees them through the imports under ``TYPE_CHECKING``, which name the same modules as
the table (the lazy ``__getattr__`` is hidden from them, so an unknown name is a type error).
No module of the harness imports this package: each imports the module it needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from harness.core.version import __version__

if TYPE_CHECKING:
    from harness.attribution.holder import Holder as Holder
    from harness.attribution.holders import attribute as attribute
    from harness.attribution.phase import PhaseAttribution as PhaseAttribution
    from harness.attribution.snapshot import Snapshot as Snapshot
    from harness.attribution.snapshot import live_tensors as live_tensors
    from harness.core.errors import (
        BadArgument as BadArgument,
    )
    from harness.core.errors import (
        BadInput as BadInput,
    )
    from harness.core.errors import (
        LeakgateError as LeakgateError,
    )
    from harness.core.errors import (
        UnwritableReport as UnwritableReport,
    )
    from harness.core.units import parse_size as parse_size
    from harness.measure.probes import CpuProbe as CpuProbe
    from harness.measure.probes import CudaProbe as CudaProbe
    from harness.measure.probes import Probe as Probe
    from harness.measure.sample import Sample as Sample
    from harness.recorder import DeviceOutOfMemory as DeviceOutOfMemory
    from harness.recorder import Recorder as Recorder
    from harness.report.run import Run as Run
    from harness.report.sections import render_report as render_report
    from harness.results.artifacts import (
        compare_runs as compare_runs,
    )
    from harness.results.artifacts import (
        load_run_document as load_run_document,
    )
    from harness.results.artifacts import (
        save_run as save_run,
    )
    from harness.results.artifacts import (
        write_index as write_index,
    )
    from harness.results.finish import MemoryCheckFailed as MemoryCheckFailed
    from harness.results.finish import finish_run as finish_run
    from harness.rules.context import Context as Context
    from harness.rules.context import Group as Group
    from harness.rules.judging import judge as judge
    from harness.rules.registry import register_rule as register_rule
    from harness.timeline.jsonl import Timeline as Timeline
    from harness.timeline.jsonl import read_timeline as read_timeline
    from harness.verdict.model import (
        Check as Check,
    )
    from harness.verdict.model import (
        Evidence as Evidence,
    )
    from harness.verdict.model import (
        Finding as Finding,
    )
    from harness.verdict.model import (
        Kind as Kind,
    )
    from harness.verdict.model import (
        Outcome as Outcome,
    )
    from harness.verdict.model import (
        PhaseStats as PhaseStats,
    )
    from harness.verdict.model import (
        Status as Status,
    )
    from harness.verdict.model import (
        Verdict as Verdict,
    )
    from harness.verdict.options import (
        Rules as Rules,
    )

_EXPORTS = {
    "LeakgateError": "harness.core.errors",
    "BadInput": "harness.core.errors",
    "BadArgument": "harness.core.errors",
    "UnwritableReport": "harness.core.errors",
    "MemoryCheckFailed": "harness.results.finish",
    "parse_size": "harness.core.units",
    "Sample": "harness.measure.sample",
    "judge": "harness.rules.judging",
    "register_rule": "harness.rules.registry",
    "Context": "harness.rules.context",
    "Group": "harness.rules.context",
    "Rules": "harness.verdict.options",
    "Verdict": "harness.verdict.model",
    "Finding": "harness.verdict.model",
    "Evidence": "harness.verdict.model",
    "PhaseStats": "harness.verdict.model",
    "Check": "harness.verdict.model",
    "Kind": "harness.verdict.model",
    "Status": "harness.verdict.model",
    "Outcome": "harness.verdict.model",
    "finish_run": "harness.results.finish",
    "Probe": "harness.measure.probes",
    "CpuProbe": "harness.measure.probes",
    "CudaProbe": "harness.measure.probes",
    "Recorder": "harness.recorder",
    "DeviceOutOfMemory": "harness.recorder",
    "Timeline": "harness.timeline.jsonl",
    "read_timeline": "harness.timeline.jsonl",
    "Run": "harness.report.run",
    "render_report": "harness.report.sections",
    "save_run": "harness.results.artifacts",
    "write_index": "harness.results.artifacts",
    "load_run_document": "harness.results.artifacts",
    "compare_runs": "harness.results.artifacts",
    "Holder": "harness.attribution.holder",
    "Snapshot": "harness.attribution.snapshot",
    "PhaseAttribution": "harness.attribution.phase",
    "live_tensors": "harness.attribution.snapshot",
    "attribute": "harness.attribution.holders",
}


if not TYPE_CHECKING:  # hidden from type checkers, so that ``harness.NoSuchName`` is an error

    def __getattr__(name: str) -> Any:
        module = _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module 'harness' has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)


__all__ = ["__version__", *_EXPORTS]

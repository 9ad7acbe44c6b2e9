"""leakgate's harness: record device memory at named checkpoints and judge the timeline.

Names are imported lazily so that loading the pytest plugin does not import torch; a type
checker sees them through the imports under ``TYPE_CHECKING``, which name the same modules as
the table (the lazy ``__getattr__`` is hidden from them, so an unknown name is a type error).
No module of the harness imports this package: each imports the module it needs.

``__all__`` is the API, with :mod:`harness.integrations.lightning` the one other import path a
user needs; every other module is internal, and its name says so (``harness._rules``,
``harness._recorder``): it may change without notice.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from harness._core.version import __version__

if TYPE_CHECKING:
    from harness._attribution.holder import Holder as Holder
    from harness._attribution.holders import attribute as attribute
    from harness._attribution.native import recheck as recheck
    from harness._attribution.phase import PhaseAttribution as PhaseAttribution
    from harness._attribution.snapshot import Snapshot as Snapshot
    from harness._attribution.snapshot import live_tensors as live_tensors
    from harness._core.errors import (
        BadArgument as BadArgument,
    )
    from harness._core.errors import (
        BadInput as BadInput,
    )
    from harness._core.errors import (
        LeakgateError as LeakgateError,
    )
    from harness._core.errors import (
        UnwritableReport as UnwritableReport,
    )
    from harness._core.units import parse_size as parse_size
    from harness._frontends.distributed import finish_distributed as finish_distributed
    from harness._frontends.distributed import max_local_ranks as max_local_ranks
    from harness._frontends.distributed import run_ranks as run_ranks
    from harness._measure.probes import CpuProbe as CpuProbe
    from harness._measure.probes import CudaProbe as CudaProbe
    from harness._measure.probes import Probe as Probe
    from harness._measure.sample import Sample as Sample
    from harness._recorder import DeviceOutOfMemory as DeviceOutOfMemory
    from harness._recorder import Recorder as Recorder
    from harness._report.run import Run as Run
    from harness._report.sections import render_report as render_report
    from harness._results.artifacts import (
        compare_runs as compare_runs,
    )
    from harness._results.artifacts import (
        load_run_document as load_run_document,
    )
    from harness._results.artifacts import (
        save_run as save_run,
    )
    from harness._results.artifacts import (
        write_index as write_index,
    )
    from harness._results.finish import MemoryCheckFailed as MemoryCheckFailed
    from harness._results.finish import finish_run as finish_run
    from harness._rules.context import Context as Context
    from harness._rules.context import Group as Group
    from harness._rules.judging import judge as judge
    from harness._rules.registry import register_rule as register_rule
    from harness._timeline.jsonl import Timeline as Timeline
    from harness._timeline.jsonl import read_timeline as read_timeline
    from harness._verdict.model import (
        Check as Check,
    )
    from harness._verdict.model import (
        Evidence as Evidence,
    )
    from harness._verdict.model import (
        Finding as Finding,
    )
    from harness._verdict.model import (
        Kind as Kind,
    )
    from harness._verdict.model import (
        Outcome as Outcome,
    )
    from harness._verdict.model import (
        PhaseStats as PhaseStats,
    )
    from harness._verdict.model import (
        Status as Status,
    )
    from harness._verdict.model import (
        Verdict as Verdict,
    )
    from harness._verdict.options import (
        Rules as Rules,
    )

_EXPORTS = {
    "LeakgateError": "harness._core.errors",
    "BadInput": "harness._core.errors",
    "BadArgument": "harness._core.errors",
    "UnwritableReport": "harness._core.errors",
    "MemoryCheckFailed": "harness._results.finish",
    "parse_size": "harness._core.units",
    "Sample": "harness._measure.sample",
    "judge": "harness._rules.judging",
    "register_rule": "harness._rules.registry",
    "Context": "harness._rules.context",
    "Group": "harness._rules.context",
    "Rules": "harness._verdict.options",
    "Verdict": "harness._verdict.model",
    "Finding": "harness._verdict.model",
    "Evidence": "harness._verdict.model",
    "PhaseStats": "harness._verdict.model",
    "Check": "harness._verdict.model",
    "Kind": "harness._verdict.model",
    "Status": "harness._verdict.model",
    "Outcome": "harness._verdict.model",
    "finish_run": "harness._results.finish",
    "Probe": "harness._measure.probes",
    "CpuProbe": "harness._measure.probes",
    "CudaProbe": "harness._measure.probes",
    "Recorder": "harness._recorder",
    "DeviceOutOfMemory": "harness._recorder",
    "Timeline": "harness._timeline.jsonl",
    "read_timeline": "harness._timeline.jsonl",
    "Run": "harness._report.run",
    "render_report": "harness._report.sections",
    "save_run": "harness._results.artifacts",
    "write_index": "harness._results.artifacts",
    "load_run_document": "harness._results.artifacts",
    "compare_runs": "harness._results.artifacts",
    "Holder": "harness._attribution.holder",
    "Snapshot": "harness._attribution.snapshot",
    "PhaseAttribution": "harness._attribution.phase",
    "live_tensors": "harness._attribution.snapshot",
    "attribute": "harness._attribution.holders",
    "recheck": "harness._attribution.native",
    "run_ranks": "harness._frontends.distributed",
    "finish_distributed": "harness._frontends.distributed",
    "max_local_ranks": "harness._frontends.distributed",
}


if not TYPE_CHECKING:  # hidden from type checkers, so that ``harness.NoSuchName`` is an error

    def __getattr__(name: str) -> Any:
        module = _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module 'harness' has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)


__all__ = ["__version__", *_EXPORTS]

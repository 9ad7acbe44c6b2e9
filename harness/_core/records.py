"""The JSON records a run writes, typed for the code that reads them: a timeline's header
(:class:`Header`) and a holder named in a report (:class:`HolderRecord`). Any key may be
missing from a record read back from a file; readers check a value before they use it."""

from __future__ import annotations

from typing import Any, TypedDict


class RankFields(TypedDict):
    """Which rank of a distributed run wrote a timeline, as its header says it."""

    rank: int
    world_size: int
    local_rank: int | None
    backend: str | None


class Header(TypedDict, total=False):
    """A timeline's header: versions, the probe and its device, the run's capacity, where and
    when it ran, the caller's config and meta, and (when given) its rules and rank."""

    leakgate: str
    run_id: str
    torch: str
    python: str
    probe: str
    primary: str
    metrics: list[str]
    device: str
    total_memory: int | None
    driver: str | None
    cuda: str | None
    capacity: int | None
    capacity_emulated: bool
    capacity_metric: str
    host: str
    pid: int
    started: float
    git_commit: str | None
    config: dict[str, Any] | None
    meta: dict[str, Any]
    notes: list[str]
    children: Any
    stride: dict[str, Any] | None
    rules: dict[str, Any]
    rank: int
    world_size: int
    local_rank: int | None
    backend: str | None
    ranks: list[dict[str, Any]]


class HolderRecord(TypedDict, total=False):
    """A holder as a verdict's JSON keeps it
    (:meth:`harness._attribution.holder.Holder.to_dict`)."""

    path: str
    container: str
    items: int
    tensors: int
    bytes: int
    graph_bytes: int
    sites: list[str]
    phase: str | None
    epoch: int | None
    label: str | None
    note: str
    growth: int | None
    process: str | None
    rank: int

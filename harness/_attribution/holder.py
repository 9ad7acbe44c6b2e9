"""A holder: the reference a user edits to free leaked memory, with what it keeps (its items,
tensors and new bytes), where the search ran and what a person should know about the answer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, cast

from harness._core.records import HolderRecord
from harness._core.units import format_size
from harness._core.wording import plural
from harness._verdict.fields import check_fields


@dataclass(frozen=True)
class Holder:
    """Tensors kept alive by one reference: ``path`` names it (``Trainer._attn_cache``),
    ``container`` is the type of what it holds (``list``, ``dict``, ``tensor``), ``items`` that
    container's length (the number of tensors for other objects), ``tensors`` the tensors under
    it, ``bytes`` their new storage, each counted once, ``graph_bytes`` the part of ``bytes``
    saved by their autograd graphs, ``sites`` the CUDA allocation sites, largest first.
    ``phase``, ``epoch`` and ``label`` say which checkpoint the attribution ran at, ``growth``
    how much its phase had grown by then (when a recorder's attribution knows it); ``note``
    what a person should know about the answer (a cycle only ``gc`` frees, a library holding
    the memory, a search cut short); ``process`` the child it was named in (``worker 0``), None
    for the recording process."""

    path: str
    container: str
    items: int
    tensors: int
    bytes: int
    graph_bytes: int = 0
    sites: tuple[str, ...] = ()
    phase: str | None = None
    epoch: int | None = None
    label: str | None = None
    note: str = ""
    growth: int | None = None
    process: str | None = None

    def __post_init__(self) -> None:
        check_fields(self)  # a BadArgument naming Holder.<field> for a value of another kind

    def __str__(self) -> str:
        note = f"; {self.note}" if self.note else ""
        items = plural(self.items, "item")
        return f"{self.path} ({self.container}, {items}, {format_size(self.bytes)}{note})"

    def to_dict(self) -> HolderRecord:
        """A JSON-ready dict."""
        data = asdict(self)
        data["sites"] = list(self.sites)
        return cast(HolderRecord, data)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Holder:
        """Inverse of :meth:`to_dict`; unknown keys are ignored."""
        known = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        known["sites"] = tuple(known.get("sites", ()))
        return cls(**known)

"""The history store: a parquet dataset of runs, one file per appended run.

A history is a folder (local, or any URI :meth:`pyarrow.fs.FileSystem.from_uri` opens) holding
:data:`MARKER` and one ``<time>-<id>.parquet`` file per run, each written whole under a hidden
temporary name and then renamed into place, so concurrent writers never collide and a killed
writer leaves only a hidden temporary file, which no reader (nor any parquet engine) reads.
On an object store where an object appears whole when its upload completes (S3, GCS), the file
is written under its own name: a killed writer leaves nothing there. A row is one test or traced
run (:class:`HistoryRow`, whose fields declare the columns); a file is read only when it has
every column, of its type, and no row lacks what every row has.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import io
import os
import platform
import uuid
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import NoneType, UnionType
from typing import Annotated, Any, Literal, get_args, get_origin, get_type_hints

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from harness._core.errors import BadInput, UnwritableReport
from harness._core.fsio import make_folders, probe_folder, write_atomic
from harness._core.git import git
from harness._history.remote import WHOLE_ON_CLOSE, contact, open_uri, problem, unreachable
from harness._verdict.model import Status

MARKER = "_leakgate_history.json"
"""The file that makes a folder a history (a leading ``_``: parquet readers skip it)."""
SCHEMA_KEY = b"leakgate_history"
VERSION = b"1"


@dataclass(frozen=True)
class HistoryRow:
    """One test's (or traced run's) history_summary in one run; each field is a column, of the arrow
    type its annotation carries (``docs/history.md`` says what each holds)."""

    commit: Annotated[str | None, pa.string()]
    dirty: Annotated[bool | None, pa.bool_()]
    branch: Annotated[str | None, pa.string()]
    time: Annotated[datetime.datetime, pa.timestamp("us", tz="UTC")]
    run: Annotated[str, pa.string()]
    source: Annotated[str, pa.string()]
    test: Annotated[str, pa.string()]
    metric: Annotated[str | None, pa.string()]
    growth: Annotated[float | None, pa.float64()]
    peak: Annotated[float | None, pa.float64()]
    teardown: Annotated[float | None, pa.float64()]
    status: Annotated[str, pa.string()]
    holder: Annotated[str | None, pa.string()]
    fingerprint: Annotated[str, pa.string()]
    device: Annotated[str | None, pa.string()]
    device_model: Annotated[str | None, pa.string()]
    torch: Annotated[str | None, pa.string()]
    cpu_model: Annotated[str | None, pa.string()]
    cores: Annotated[int | None, pa.int32()]


_HINTS = get_type_hints(HistoryRow, include_extras=True)
SCHEMA = pa.schema(
    [pa.field(name, hint.__metadata__[0]) for name, hint in _HINTS.items()],
    metadata={SCHEMA_KEY: VERSION},
)
REQUIRED = tuple(
    name
    for name, hint in _HINTS.items()
    if not (get_origin(hint.__origin__) is UnionType and NoneType in get_args(hint.__origin__))
)
"""The columns no row may leave empty (their fields do not take None)."""
FINGERPRINT = ("device", "device_model", "torch", "cpu_model", "cores")


@dataclass(frozen=True)
class History:
    """An opened history: its filesystem and the folder's path on it, as given (``where``)."""

    fs: pafs.FileSystem
    path: str
    where: str

    @property
    def local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    def files(self) -> list[str]:
        """The runs' files, oldest first (their names begin with their time)."""
        try:
            found = self.fs.get_file_info(pafs.FileSelector(self.path, allow_not_found=True))
        except (OSError, pa.ArrowException) as exc:
            raise BadInput(f"cannot list ({problem(exc)})", path=self.where) from None
        return sorted(
            info.path
            for info in found
            if info.type == pafs.FileType.File
            and info.base_name.endswith(".parquet")
            and not info.base_name.startswith((".", "_"))
        )


def open_history(
    given: str | os.PathLike[str], *, mode: Literal["read", "check", "append"] = "read"
) -> History:
    """The history at ``given``. To ``read``, a folder with :data:`MARKER`; to ``check`` or
    ``append``, also a new or empty folder, which ``append`` makes a history now (``check``
    only asks, locally, that it can be written). ``BadInput`` (one line) for an unreadable
    URI, a store that fails or does not answer (:func:`~harness._history.remote.contact`), a
    file, a folder holding other things, or a marker that is not ours."""
    where = os.fspath(given)
    try:
        if "://" in where:
            fs, path = open_uri(where)
        else:
            fs, path = pafs.LocalFileSystem(), os.path.abspath(where)
        history = History(fs, path.rstrip("/") or "/", where)
        if history.local:
            kind, names = _look(history)
        else:
            kind, names = contact(fs, lambda: _look(history), where)
        marked = MARKER in names and _read_marker(history)
    except BadInput:
        raise
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise BadInput(f"cannot open the history ({problem(exc)})", path=where) from None
    # hidden names: another writer's marker or run on its way
    empty = kind == pafs.FileType.NotFound or all(n.startswith(".") for n in names)
    if kind not in (pafs.FileType.Directory, pafs.FileType.NotFound):
        raise BadInput("not a history: a history is a folder", path=where)
    if not marked and not empty:
        raise BadInput(f"not a history (no {MARKER}, and not empty)", path=where)
    if not marked and mode == "read":
        what = "no such history" if kind == pafs.FileType.NotFound else "an empty folder"
        raise BadInput(f"{what}: nothing appended yet", path=where)
    if mode == "check" and history.local:
        try:
            probe_folder(history.path)
        except OSError as exc:
            said = f"cannot be written ({exc.filename}: {exc.strerror or exc})"
            raise BadInput(said, path=where) from None
    if not marked and mode == "append":
        _make(history)
    return history


def _look(history: History) -> tuple[pafs.FileType, list[str]]:
    """What the history's path is, and the names in it when it is a folder (only the marker's
    where it has one: a long history is listed once, when it is read). On a store a folder
    without a marker, or a marker's lookup that failed on an answer, is listed before its path
    is looked up: a listing says what a lookup of one key does not (no bucket, which
    credentials, an endpoint that is not a store's), and a folder there is what holds
    something."""
    fs, path = history.fs, history.path
    try:
        if fs.get_file_info(f"{path}/{MARKER}").type == pafs.FileType.File:
            return pafs.FileType.Directory, [MARKER]
    except (OSError, pa.ArrowException) as exc:
        if history.local or unreachable(exc):
            raise
    if not history.local:
        try:  # allowed to be missing, a listing would take any 404 for a missing folder
            names = [e.base_name for e in fs.get_file_info(pafs.FileSelector(path))]
        except FileNotFoundError:
            names = []
        if names:
            return pafs.FileType.Directory, names
    kind = fs.get_file_info(path).type
    if kind != pafs.FileType.Directory or not history.local:
        return kind, []
    return kind, [e.base_name for e in fs.get_file_info(pafs.FileSelector(path))]


def history_around(
    written: str | os.PathLike[str], history: str | os.PathLike[str] | None = None
) -> str | None:
    """The local history that ``written`` (a file or folder leakgate is to write) would lie in,
    where every parquet engine reading the history would meet it: a folder at or above it that
    holds :data:`MARKER`, or ``history`` (a local folder, made yet or not) when it is one of
    them. None when there is none."""
    folder = Path(os.path.realpath(written))
    around = [folder, *folder.parents]
    if history is not None and "://" not in os.fspath(history):
        mine = Path(os.path.realpath(history))
        if mine in around:
            return os.fspath(history)
    for above in around:
        if (above / MARKER).is_file():
            return str(above)
    return None


def _read_marker(history: History) -> bool:
    """Whether the folder holds our :data:`MARKER`; ``BadInput`` for one that is not ours."""
    marker = f"{history.path}/{MARKER}"
    try:
        if history.fs.get_file_info(marker).type != pafs.FileType.File:
            return False
        with history.fs.open_input_stream(marker) as stream:
            text = stream.read(4096)
    except (OSError, pa.ArrowException) as exc:
        raise BadInput(f"cannot read ({problem(exc)})", path=marker) from None
    if b'"leakgate-history/' not in text:
        raise BadInput("not a leakgate history marker", path=marker)
    return True


def _make(history: History) -> None:
    marker = b'{"schema": "leakgate-history/1", "files": "<time>-<id>.parquet, one per run"}\n'
    try:
        if history.local:
            make_folders(history.path)
        else:
            history.fs.create_dir(history.path, recursive=True)
        _put(history, MARKER, marker)
    except (OSError, pa.ArrowException) as exc:
        raise UnwritableReport(history.where, problem(exc)) from None


def _put(history: History, name: str, data: bytes) -> str:
    """Write ``data`` as ``name`` in the history, whole or not at all: locally through
    :func:`~harness._core.fsio.write_atomic`; on a store where an object appears whole when its
    upload completes, under its name; elsewhere under a hidden name, then moved."""
    target = f"{history.path}/{name}"
    if history.local:
        return str(write_atomic(target, data))
    whole = history.fs.type_name in WHOLE_ON_CLOSE
    written = target if whole else f"{history.path}/.{name}.{uuid.uuid4().hex}.tmp"
    with history.fs.open_output_stream(written) as stream:
        stream.write(data)
    if not whole:
        history.fs.move(written, target)
    return target


def append(history: History, rows: Sequence[HistoryRow]) -> str | None:
    """Write ``rows`` (one run's) as one new file; its path, or None when there are none.
    :class:`~harness._core.errors.UnwritableReport` when it cannot be written (nothing is then read
    of it)."""
    if not rows:
        return None
    table = pa.Table.from_pylist([dataclasses.asdict(r) for r in rows], schema=SCHEMA)
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd")
    try:
        return _put(history, f"{rows[0].run}.parquet", buffer.getvalue())
    except (OSError, pa.ArrowException) as exc:
        raise UnwritableReport(history.where, problem(exc)) from None


def new_run() -> tuple[str, datetime.datetime]:
    """A run's id (its file's name: the time first, so names sort as runs were appended) and
    its time."""
    now = datetime.datetime.now(datetime.UTC)
    return f"{now:%Y%m%dT%H%M%S%f}-{uuid.uuid4().hex[:12]}", now


STRINGS = tuple(f.name for f in SCHEMA if pa.types.is_string(f.type))
FILTERED = ("time", "metric", "fingerprint", "cpu_model", "cores")
"""The columns a reading's filter may name."""
FOREIGN = "not a leakgate history file (foreign schema)"
FOREIGN_WHY = "not a leakgate history file"
READ_AHEAD = 8
"""Files read at once, ahead of the one being handed over."""


def scan(
    history: History,
    columns: Sequence[str],
    where: ds.Expression | None = None,
    *,
    newest_first: bool = False,
) -> Iterator[pa.RecordBatch]:
    """The history's rows that ``where`` (over :data:`FILTERED` columns) takes, a file at a time
    in the order runs were appended (the newest first with ``newest_first``), only ``columns``
    (strings as dictionaries, as parquet keeps them). At most :data:`READ_AHEAD` files are held
    at once, whatever the history's length. ``BadInput`` naming a file that is not a history's
    (not parquet, a foreign schema)."""
    files = history.files()[:: -1 if newest_first else 1]
    wanted = list(dict.fromkeys([*columns, *(FILTERED if where is not None else ())]))
    with ThreadPoolExecutor(READ_AHEAD) as pool:
        pending: deque[Future[pa.Table]] = deque()
        for path in files:
            pending.append(pool.submit(_read, history, path, wanted, where))
            if len(pending) >= READ_AHEAD:
                yield from pending.popleft().result().select(list(columns)).to_batches()
        while pending:
            yield from pending.popleft().result().select(list(columns)).to_batches()


def _read(history: History, path: str, columns: list[str], where: ds.Expression | None) -> pa.Table:
    try:
        with history.fs.open_input_file(path) as source:
            footer = pq.read_metadata(source)
            check_schema(footer.schema.to_arrow_schema(), path)
            parquet = pq.ParquetFile(source, metadata=footer, read_dictionary=STRINGS)
            table = parquet.read(columns=columns, use_threads=False)
    except (OSError, pa.ArrowException) as exc:
        raise BadInput(f"cannot read ({problem(exc)})", path=path) from None
    for name in REQUIRED:
        if name in columns and table.column(name).null_count:
            raise BadInput(f"{FOREIGN_WHY}: a row without a {name}", path=path)
    return table if where is None else table.filter(where)


def check_schema(found: pa.Schema, path: str) -> None:
    """``BadInput`` unless ``found`` (a file's schema) is a history's: the key in its metadata,
    and each of :data:`SCHEMA`'s columns, of its type (a dictionary of strings counts as
    strings). Columns of its own beside them are left alone."""
    if (found.metadata or {}).get(SCHEMA_KEY) != VERSION:
        raise BadInput(FOREIGN, path=path)
    for field in SCHEMA:
        if field.name not in found.names:
            raise BadInput(f"{FOREIGN_WHY}: no {field.name} column", path=path)
        kind = found.field(field.name).type
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
        if kind != field.type:
            said = f"{FOREIGN_WHY}: its {field.name} column is {kind}, a history's is {field.type}"
            raise BadInput(said, path=path)


def history_summary(document: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a row that a verdict document gives: the test, metric, growth, peak,
    teardown, status, top holder, and its header's device and torch."""
    from harness._report.issues import holder_text  # the report's words for a holder

    phases = [p for p in document.get("phases") or () if isinstance(p, Mapping)]
    peaks = [float(p["peak_rise"]) for p in phases if _number(p.get("peak_rise"))]  # bytes
    left = [
        float(c["measured"])
        for c in document.get("checks") or ()
        if isinstance(c, Mapping) and c.get("rule") == "teardown" and _number(c.get("measured"))
    ]
    holders = [h for h in document.get("attribution") or () if isinstance(h, Mapping)]
    top = max(holders, key=lambda h: h.get("bytes") or 0) if holders else None
    header = document.get("header")
    header = header if isinstance(header, Mapping) else {}
    growth = document.get("worst_growth")
    return {
        "test": str(document.get("test") or document.get("name") or "?"),
        "metric": document.get("metric"),
        "growth": float(growth) if isinstance(growth, (int, float)) else None,
        "peak": max(peaks) if peaks else None,
        "teardown": max(left) if left else None,
        "status": str(document.get("status", Status.ERROR)),
        "holder": str(holder_text(top)) if top is not None else None,
        "device": _text(header.get("probe")),
        "device_model": _text(header.get("device")),
        "torch": _text(header.get("torch")),
    }


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class HistoryPlace:
    """Where and when a run is appended: the commit, tree, branch, and this machine's CPU."""

    commit: str | None
    dirty: bool | None
    branch: str | None
    cpu_model: str | None
    cores: int | None

    @classmethod
    def here(cls, cwd: str | os.PathLike[str] | None = None) -> HistoryPlace:
        """The git repository around ``cwd`` (none outside one) and this machine."""
        commit = git("rev-parse", "HEAD", cwd=cwd)
        changes = git("status", "--porcelain", "--untracked-files=no", cwd=cwd)
        branch = git("rev-parse", "--abbrev-ref", "HEAD", cwd=cwd)
        if branch == "HEAD":  # detached, as CI checks out: the CI's name for it
            branch = os.environ.get("GITHUB_HEAD_REF") or os.environ.get("GITHUB_REF_NAME")
        dirty = None if commit is None else bool(changes)
        return cls(commit, dirty, branch or None, _cpu_model(), os.cpu_count())

    def rows(self, summaries: Sequence[Mapping[str, Any]], source: str) -> list[HistoryRow]:
        """One run's rows, one per history_summary (:func:`history_summary`)."""
        run, now = new_run()
        made = []
        for s in summaries:
            machine: dict[str, Any] = {
                "device": s.get("device"),
                "device_model": s.get("device_model"),
                "torch": s.get("torch"),
                "cpu_model": self.cpu_model,
                "cores": self.cores,
            }
            made.append(
                HistoryRow(
                    commit=self.commit,
                    dirty=self.dirty,
                    branch=self.branch,
                    time=now,
                    run=run,
                    source=source,
                    test=str(s.get("test")),
                    metric=s.get("metric"),
                    growth=s.get("growth"),
                    peak=s.get("peak"),
                    teardown=s.get("teardown"),
                    status=str(s.get("status")),
                    holder=s.get("holder"),
                    fingerprint=fingerprint(machine),
                    **machine,
                )
            )
        return made


def fingerprint(machine: Mapping[str, Any]) -> str:
    """A machine's fingerprint: a short hash of its :data:`FINGERPRINT` fields."""
    text = "\x1f".join(str(machine.get(k)) for k in FINGERPRINT)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or None

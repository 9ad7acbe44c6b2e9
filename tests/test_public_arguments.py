"""The verdict model's values (``Finding``, ``Evidence``, ``PhaseStats``, ``Check``, ``Verdict``
and its enums), ``Holder``, ``finish_run`` and ``MemoryCheckFailed`` refuse what they cannot take
with :class:`harness.BadArgument` (a ``TypeError`` and a ``ValueError``), a wrong type and a
wrong value alike, in one line; what they take raises nothing. A dataclass's fields are drawn
from their annotations: each refuses a value of another kind. (``Rules``, ``Recorder``,
``run_ranks``, ``LeakGateCallback`` and ``judge``: tests/test_refused_arguments.py.)"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import (
    BadArgument,
    Check,
    Evidence,
    Finding,
    Holder,
    Kind,
    MemoryCheckFailed,
    Outcome,
    PhaseStats,
    Recorder,
    Rules,
    Sample,
    Status,
    Timeline,
    Verdict,
    finish_run,
    read_timeline,
)
from harness._core.errors import Raised
from harness._verdict.model import CheckStatus, Severity

Pair = tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]
"""What an argument takes, and what it refuses."""

TEXT = st.text(max_size=12)
NAMES = st.text("abcdefghij_-", min_size=1, max_size=12)
WHOLE = st.integers(-(2**40), 2**40)
FINITE = st.one_of(st.floats(allow_nan=False, allow_infinity=False), WHOLE)
NOT_TEXT = st.one_of(WHOLE, st.floats(), st.binary(max_size=4), st.lists(WHOLE, max_size=2))
NOT_WHOLE = st.one_of(st.booleans(), st.floats(), TEXT, st.lists(WHOLE, max_size=2))
NOT_FINITE = st.one_of(st.sampled_from([math.nan, math.inf, -math.inf, True]), TEXT)
NOT_FLAG = st.one_of(WHOLE, st.floats(), TEXT)
KINDS: dict[Any, Pair] = {
    str: (TEXT, st.one_of(NOT_TEXT, st.none())),
    int: (WHOLE, st.one_of(NOT_WHOLE, st.none())),
    float: (FINITE, st.one_of(NOT_FINITE, st.none())),
    bool: (st.booleans(), st.one_of(NOT_FLAG, st.none())),
}
ROWS: dict[type, Callable[[], st.SearchStrategy[Any]]] = {}
"""A strategy of whole valid instances, for the fields that hold them."""


def _enum(names: type[StrEnum]) -> Pair:
    """Its members and their names; other text, numbers and nothing."""
    valid = [*names, *(str(m) for m in names)]
    other = TEXT.filter(lambda t: t not in valid)
    return st.sampled_from(valid), st.one_of(other, WHOLE, st.none())


def _pair(hint: Any) -> Pair:
    """What a field of this annotation takes and refuses."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is types.UnionType:
        (inner,) = (a for a in args if a is not type(None))
        taken, refused = _pair(inner)
        return st.one_of(st.none(), taken), refused.filter(lambda v: v is not None)
    if typing.get_origin(hint) is tuple:
        taken, refused = _pair(args[0])
        return (
            st.lists(taken, max_size=2).map(tuple),
            st.one_of(WHOLE, st.lists(refused, min_size=1, max_size=2)),
        )
    if isinstance(hint, type) and issubclass(hint, StrEnum):
        return _enum(hint)
    if hint in KINDS:
        return KINDS[hint]
    if hint is Rules:
        return st.just(Rules()), st.one_of(WHOLE, TEXT, st.just({"warmup": 1}))
    return st.deferred(ROWS[hint]), st.one_of(WHOLE, TEXT, st.just({}))


def _fields(cls: type) -> dict[str, Pair]:
    hints = typing.get_type_hints(cls)
    return {f.name: _pair(hints[f.name]) for f in dataclasses.fields(cls)}


RECORDS = (Finding, Evidence, PhaseStats, Check, Verdict, Holder)
for _record in RECORDS:
    ROWS[_record] = lambda cls=_record: st.fixed_dictionaries(
        {name: taken for name, (taken, _) in _fields(cls).items()}
    ).map(lambda values, cls=cls: cls(**values))


def _finish_table(folder: Path) -> dict[str, Pair]:
    paths = st.uuids().map(lambda u: folder / f"{u}.md")
    bad_paths = st.one_of(WHOLE, st.just(""), st.just("a\0b"), st.just("x" * 300))
    warmups = st.fixed_dictionaries({"warmup": st.integers(0, 9)})
    return {
        "rules": (
            st.one_of(st.none(), st.just(Rules()), warmups),
            st.one_of(WHOLE, TEXT, st.just({"bogus": 1}), st.just({"warmup": -1})),
        ),
        "name": (NAMES, st.one_of(NOT_TEXT, st.none())),
        "error": (
            st.one_of(st.none(), TEXT, st.builds(ValueError, NAMES), st.just(Raised("E", "x"))),
            st.one_of(WHOLE, st.binary(max_size=3), st.lists(WHOLE, max_size=2)),
        ),
        "directory": (st.sampled_from([None, folder, str(folder)]), bad_paths),
        "markdown": (st.one_of(st.none(), paths, paths.map(str)), bad_paths),
        "document": (st.one_of(st.none(), paths.map(lambda p: p.with_suffix(".json"))), bad_paths),
        "timeline": (st.one_of(st.none(), paths.map(lambda p: p.with_suffix(".jsonl"))), bad_paths),
        "title": (st.one_of(st.none(), TEXT), NOT_TEXT),
    }


def _recorded(folder: Path, name: str) -> Recorder:
    """A short run, recorded into ``folder/name.jsonl`` and not yet finished."""
    recorder = Recorder("cpu", timeline=folder / f"{name}.jsonl")
    with recorder.phase("train", epoch=0):
        for batch in range(3):
            recorder.checkpoint("TRAIN_BATCH", batch=batch)
    return recorder


TIMELINE = Timeline({"run_id": "read"}, [Sample("TRAIN_START"), Sample("TRAIN_END")])
"""A run as read back, finished without a recorder."""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("public")


def _arguments(data: st.DataObject, table: dict[str, Pair], broken: str | None) -> dict[str, Any]:
    return {
        name: data.draw(refused if name == broken else taken, label=name)
        for name, (taken, refused) in table.items()
    }


def _refused(call: Callable[[], Any]) -> BadArgument:
    with pytest.raises(BadArgument) as refused:
        call()
    assert isinstance(refused.value, TypeError) and isinstance(refused.value, ValueError)
    assert str(refused.value) and "\n" not in str(refused.value)
    return refused.value


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_field_of_another_kind_is_refused_by_name(cls, data):
    table = _fields(cls)
    broken = data.draw(st.sampled_from(sorted(table)), label="refused")
    arguments = _arguments(data, table, broken)
    refused = _refused(lambda: cls(**arguments))
    assert (refused.field or "").startswith(f"{cls.__name__}.{broken}")


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_fields_of_their_kind_are_taken(cls, data):
    made = cls(**_arguments(data, _fields(cls), None))
    if isinstance(made, Finding | Verdict):  # read back as it is written
        assert type(made).from_dict(made.to_dict()) == made


@pytest.mark.parametrize("names", [Kind, Status, Outcome, Severity, CheckStatus])
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_an_enum_refuses_a_name_outside_it(names, data):
    taken, refused = _enum(names)
    assert names(data.draw(taken)) in names
    value = data.draw(refused)
    assert f"is not a valid {names.__name__} (one of " in str(_refused(lambda: names(value)))


def test_a_verdict_document_with_a_status_outside_it_is_bad_input():
    document = Verdict("PASS").to_dict() | {"status": "bogus"}
    with pytest.raises(ValueError) as read:
        Verdict.from_dict(document)
    assert not isinstance(read.value, TypeError)  # the file's fault, not a caller's
    assert read.value.field == "Verdict.status"


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_finish_run_refuses_an_argument_before_it_ends_the_run(folder, data):
    table = _finish_table(folder)
    broken = data.draw(st.sampled_from(["record", *sorted(table)]), label="refused")
    arguments = _arguments(data, table, broken if broken != "record" else None)
    name = data.draw(st.uuids(), label="run").hex
    recorder = _recorded(folder, name)
    try:
        record = data.draw(st.one_of(WHOLE, TEXT, st.none())) if broken == "record" else recorder
        refused = _refused(lambda: finish_run(record, **arguments))
        if broken != "rules":  # a mapping's own field is named as Rules names it
            assert refused.field == broken
        assert read_timeline(folder / f"{name}.jsonl").end is None  # the run goes on
    finally:
        recorder.close()


def test_finish_run_refuses_a_name_that_is_no_file_name_where_it_writes(folder):
    recorder = _recorded(folder, "named")
    try:
        refused = _refused(lambda: finish_run(recorder, name="a/b", directory=folder))
        assert "'a/b' is not a plain file name" in str(refused)
        finished = finish_run(recorder, name="a/b")  # written nowhere: a name as any other
        assert finished.run.name == "a/b" and not finished.paths
    finally:
        recorder.close()


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_finish_run_takes_what_it_is_given(folder, data):
    arguments = _arguments(data, _finish_table(folder), None)
    name = data.draw(st.uuids(), label="run").hex
    with _recorded(folder, name) as recorder:
        finished = finish_run(recorder, **arguments)
    assert finished.write_error is None and finished.verdict.status in Status
    assert read_timeline(folder / f"{name}.jsonl").end is not None
    assert finish_run(TIMELINE, **arguments).verdict.status == Status.ERROR  # never ended


@settings(max_examples=20, deadline=None)
@given(value=st.one_of(WHOLE, TEXT, st.none(), st.just(TIMELINE)))
def test_memory_check_failed_carries_a_finished_run_only(value):
    refused = _refused(lambda: MemoryCheckFailed(value))
    assert refused.field == "finished"
    finished = finish_run(TIMELINE, name="read")
    assert MemoryCheckFailed(finished).verdict is finished.verdict

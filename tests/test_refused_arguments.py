"""Every argument the public API refuses raises :class:`harness.BadArgument` (a ``TypeError`` and
a ``ValueError``), a wrong type and a wrong value alike, in one line and nothing else; the
arguments it takes raise nothing. Drawn for ``Rules``, ``Recorder``, ``run_ranks``,
``LeakGateCallback`` and ``judge``: every argument valid but one, or all of them."""

import math
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import BadArgument, Recorder, Rules, judge
from harness._core.errors import Raised
from harness._core.identity import MAX_WORLD_SIZE
from harness._frontends import spawn
from harness._measure.sample import Sample
from harness._timeline.store import SampleStore

Table = dict[str, tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]]
"""Each argument of a call: what it takes, and what it refuses."""

NAMES = st.text("abcdefghij_-", min_size=1, max_size=12)
"""Plain names: phases, metrics, file names, option keys."""
NOT_TEXT = st.one_of(
    st.integers(), st.floats(), st.binary(max_size=4), st.lists(st.integers(), max_size=2)
)
NOT_FLAGS = st.one_of(st.none(), st.integers(), st.floats(), st.text(max_size=4))
SIZES = st.one_of(
    st.integers(0, 2**40),
    st.builds("{}{}".format, st.integers(0, 4096), st.sampled_from(["", "B", "KB", "MiB", " GiB"])),
)
BAD_SIZES = st.one_of(
    st.integers(max_value=-1),
    st.integers(min_value=2**61),
    st.floats(),
    st.booleans(),
    st.text("xyz!", min_size=1, max_size=6),
    st.lists(st.integers(), max_size=1),
)
BAD_PATHS = st.one_of(
    st.integers(), st.just(""), st.just("a\0b"), st.just("x" * 300), st.binary(min_size=1)
)
BAD_FILE_NAMES = st.one_of(
    st.sampled_from(["", ".", "..", ".hidden", "a/b", "a\\b", "x" * 201, "tab\there"]),
    st.integers(),
    st.binary(min_size=1, max_size=4),
)
PROBES = ("auto", "cpu", "cuda")
BAD_PROBES = st.one_of(
    st.text(max_size=6).filter(lambda t: t not in PROBES and not t.startswith("cuda:")),
    st.integers(),
    st.none(),
)
BAD_RULES = st.one_of(
    st.integers(), st.text(max_size=4), st.just({"bogus": 1}), st.just({"warmup": -1})
)
TIMEOUTS = st.one_of(st.integers(1, 10**6), st.floats(min_value=1e-3, max_value=1e6))
BAD_TIMEOUTS = st.one_of(
    st.integers(max_value=0),
    st.floats(max_value=0),
    st.sampled_from([math.inf, math.nan, True]),
    st.text(max_size=3),
)
OPTIONAL_TEXT = st.one_of(st.none(), st.text(max_size=12))
JSON_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**53), 2**53), NAMES, st.lists(st.integers(0, 9))
)


def _rules() -> Table:
    sizes = (st.one_of(st.none(), SIZES), BAD_SIZES)
    flags = (st.booleans(), NOT_FLAGS)
    counts = (
        st.integers(0, 10**6),
        st.one_of(st.integers(max_value=-1), st.none(), st.booleans(), st.floats(), NAMES),
    )
    table: Table = {
        "phase": (
            st.one_of(st.none(), NAMES, st.lists(NAMES, min_size=1, max_size=3)),
            st.one_of(
                st.sampled_from(["", [], [""], ("train", "")]),
                st.integers(),
                st.binary(min_size=1, max_size=3),
                st.lists(st.integers(), min_size=1, max_size=2),
            ),
        ),
        "warmup": counts,
        "warmup_epochs": counts,
        "project_to": (
            st.one_of(st.none(), st.integers(1, 10**6)),
            st.one_of(st.integers(max_value=0), st.booleans(), st.floats(), st.text(max_size=3)),
        ),
        "metric": (NAMES, st.one_of(st.just(""), st.none(), NOT_TEXT)),
        "child_metric": (
            st.sampled_from(["heap", "anon", "uss", "pss"]),
            st.one_of(NAMES.filter(lambda t: t not in ("heap", "anon")), st.none(), NOT_TEXT),
        ),
        "custom": (
            st.dictionaries(NAMES, JSON_VALUES, max_size=2),
            st.one_of(
                st.integers(),
                NAMES,
                st.dictionaries(st.integers(), st.integers(), min_size=1, max_size=1),
                st.dictionaries(NAMES, st.sampled_from([math.nan, math.inf, object()]), min_size=1),
            ),
        ),
        "written": (
            st.just({}),
            st.one_of(st.integers(), st.just({"max_growth": 1}), st.just({1: "1MB"})),
        ),
    }
    for name in (
        "max_growth",
        "max_peak",
        "max_drift",
        "teardown",
        "max_projected",
        "max_child_growth",
        "max_copy_on_read",
    ):
        table[name] = sizes
    for name in (
        "allow_unjudged",
        "cache_is_leak",
        "attribute",
        "explain",
        "snapshot",
        "children",
        "host",
    ):
        table[name] = flags
    return table


def _recorder(folder: Path) -> Table:
    return {
        "probe": (st.just("cpu"), BAD_PROBES),
        "capacity": (st.one_of(st.none(), SIZES), BAD_SIZES),
        "timeline": (st.one_of(st.none(), _fresh(folder)), BAD_PATHS),
        "config": (
            st.one_of(st.none(), st.dictionaries(NAMES, st.integers(), max_size=2)),
            st.one_of(st.integers(), st.text(max_size=3), st.lists(st.integers(), max_size=2)),
        ),
        "meta": (
            st.one_of(st.none(), st.dictionaries(NAMES, NAMES, max_size=2)),
            st.one_of(
                st.integers(),
                st.text(max_size=3),
                st.dictionaries(st.integers(), st.integers(), min_size=1, max_size=1),
            ),
        ),
        "attribute": (st.booleans(), NOT_FLAGS),
        "rules": (
            st.one_of(st.none(), st.just(Rules())),
            st.one_of(st.integers(), st.text(max_size=3), st.just({"warmup": 1})),
        ),
        "children": (st.one_of(st.none(), st.booleans()), st.one_of(st.integers(), NAMES)),
        "host": (st.one_of(st.none(), st.booleans()), st.one_of(st.integers(), NAMES)),
    }


def _body(recorder: Recorder, *args: Any) -> None:
    """A body a spawned rank imports by name (never run: the ranks are not started here)."""


def _run_ranks(folder: Path) -> Table:
    return {
        "body": (
            st.just(_body),
            st.one_of(st.just(lambda recorder: None), st.integers(), st.none(), NAMES),
        ),
        "nproc": (
            st.integers(1, min(2, spawn.max_local_ranks())),
            st.one_of(
                st.integers(max_value=0),
                st.integers(min_value=MAX_WORLD_SIZE + 1),
                st.booleans(),
                st.floats(),
                st.text(max_size=2),
            ),
        ),
        "name": (st.one_of(st.none(), NAMES), BAD_FILE_NAMES),
        "rules": (
            st.one_of(
                st.none(), st.just(Rules()), st.fixed_dictionaries({"warmup": st.integers(0, 9)})
            ),
            BAD_RULES,
        ),
        "directory": (st.sampled_from([None, folder, str(folder)]), BAD_PATHS),
        "args": (
            st.one_of(st.just(()), st.lists(st.integers(), max_size=3), st.tuples(NAMES)),
            st.one_of(
                st.integers(),
                st.text(max_size=3),
                st.binary(max_size=3),
                st.none(),
                st.just((_Unpicklable(),)),
            ),
        ),
        "probe": (st.just("cpu"), BAD_PROBES),
        "threads": (
            st.integers(1, 8),
            st.one_of(st.integers(max_value=0), st.booleans(), st.floats(), st.text(max_size=2)),
        ),
        "attribute": (st.booleans(), NOT_FLAGS),
        "timeout": (TIMEOUTS, BAD_TIMEOUTS),
        "title": (OPTIONAL_TEXT, NOT_TEXT),
    }


class _Unpicklable:
    """An argument a spawned rank could never be sent."""

    def __reduce__(self) -> Any:
        raise TypeError("not for pickling")


def _callback(folder: Path) -> Table:
    return {
        "recorder": (st.none(), st.one_of(st.integers(), NAMES, st.just({}))),
        "rules": (
            st.one_of(st.none(), st.just(Rules()), st.just({"max_growth": "1MB"})),
            BAD_RULES,
        ),
        "directory": (st.sampled_from([None, folder, str(folder)]), BAD_PATHS),
        "timeline": (st.one_of(st.none(), _fresh(folder)), BAD_PATHS),
        "name": (NAMES, st.one_of(BAD_FILE_NAMES, st.none())),
        "title": (OPTIONAL_TEXT, NOT_TEXT),
        "raise_on_fail": (st.booleans(), NOT_FLAGS),
        "attribute": (st.booleans(), NOT_FLAGS),
        "capacity": (st.one_of(st.none(), SIZES), BAD_SIZES),
    }


SAMPLES = st.lists(
    st.builds(
        Sample,
        label=st.sampled_from(["TRAIN_START", "TRAIN_BATCH", "TRAIN_END", "here"]),
        phase=st.sampled_from([None, "training"]),
        batch=st.one_of(st.none(), st.integers(0, 99)),
        metrics=st.fixed_dictionaries({"allocated": st.integers(0, 2**30)}),
    ),
    max_size=6,
)


def _judge(folder: Path) -> Table:
    return {
        "samples": (
            st.one_of(SAMPLES, SAMPLES.map(SampleStore.of), SAMPLES.map(tuple)),
            st.one_of(
                st.integers(),
                st.none(),
                st.text(max_size=3),
                st.lists(st.integers(), min_size=1, max_size=2),
                st.dictionaries(NAMES, st.integers(), max_size=1),
            ),
        ),
        "rules": (
            st.one_of(
                st.none(), st.just(Rules()), st.fixed_dictionaries({"warmup": st.integers(0, 9)})
            ),
            BAD_RULES,
        ),
        "error": (
            st.one_of(
                st.none(),
                st.text(max_size=12),
                st.builds(ValueError, NAMES),
                st.just(Raised("ValueError", "bad shard")),
            ),
            st.one_of(st.integers(), st.binary(max_size=3), st.lists(st.integers(), max_size=2)),
        ),
    }


def _fresh(folder: Path) -> st.SearchStrategy[str]:
    """A timeline path no other example has written."""
    return st.uuids().map(lambda u: str(folder / f"{u}.jsonl"))


def _make_run_ranks(**given: Any) -> Any:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(spawn, "_run", lambda spec: spec)  # checked, never started
        return spawn.run_ranks(**given)


def _make_callback(**given: Any) -> Any:
    from harness.integrations.lightning import LeakGateCallback

    return LeakGateCallback(**given)


def _make_recorder(**given: Any) -> Any:
    recorder = Recorder(**given)
    recorder.close()
    return recorder


CALLS: dict[str, tuple[Callable[..., Any], Callable[[Path], Table]]] = {
    "Rules": (Rules, lambda folder: _rules()),
    "Recorder": (_make_recorder, _recorder),
    "run_ranks": (_make_run_ranks, _run_ranks),
    "LeakGateCallback": (_make_callback, _callback),
    "judge": (judge, _judge),
}
NEEDS_LIGHTNING = pytest.mark.skipif(find_spec("lightning") is None, reason="needs lightning")
CALLED = [
    pytest.param(name, marks=NEEDS_LIGHTNING) if name == "LeakGateCallback" else name
    for name in CALLS
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("refused")


def _arguments(data: st.DataObject, table: Table, broken: str | None) -> dict[str, Any]:
    return {
        name: data.draw(refused if name == broken else taken, label=name)
        for name, (taken, refused) in table.items()
    }


@pytest.mark.parametrize("call", CALLED)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_refused_argument_raises_bad_argument_and_nothing_else(call, folder, data):
    make, table_of = CALLS[call]
    table = table_of(folder)
    broken = data.draw(st.sampled_from(sorted(table)), label="refused")
    arguments = _arguments(data, table, broken)
    with pytest.raises(BadArgument) as refused:
        make(**arguments)
    assert isinstance(refused.value, TypeError) and isinstance(refused.value, ValueError)
    assert str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("call", CALLED)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_arguments_taken_raise_nothing(call, folder, data):
    make, table_of = CALLS[call]
    make(**_arguments(data, table_of(folder), None))

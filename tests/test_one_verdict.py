"""A verdict is a property of the loop, not of how leakgate reads it: the same memory series read
at every batch and on the recorder's stride (every batch of the first 32, then every 16th) gets
the same verdict, and a growth within a fifth of the true one, wherever the true growth after
warm-up is clear of the budget (at least 1.25x, or at most 0.8x). The series are generated in
the shapes real loops take: a leak starting anywhere, growth that fills and stops (a cache),
steps, a sawtooth (a buffer flushed at capacity), and noise."""

import json
from dataclasses import dataclass, field, replace

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from harness._measure.sample import STRIDE, Sample
from harness._rules.fit import PLATEAU
from harness._rules.judging import judge
from harness._verdict.options import Rules

MB = 10**6
BUDGET = 4 * MB
WARMUP = 5
RULES = Rules(phase="validation", max_growth="4MB", warmup=WARMUP)


def samples(values: np.ndarray, *, strided: bool) -> list[Sample]:
    """A validation loop as a recorder writes it: START, a sample per batch (read at every
    batch, or on the stride with the unread batches' metrics left out), END."""
    level = {"allocated": int(values[0])}
    out = [Sample("VALIDATION_START", "validation", 0, None, 0.0, level)]
    for b, v in enumerate(values):
        read = not strided or STRIDE.reads(b)
        out.append(
            Sample(
                "VALIDATION_BATCH",
                "validation",
                0,
                b,
                1.0 + b,
                {"allocated": int(v)} if read else {},
            )
        )
    out.append(
        Sample(
            "VALIDATION_END",
            "validation",
            0,
            None,
            2.0 + len(values),
            {"allocated": int(values[-1])},
        )
    )
    return out


@dataclass(frozen=True)
class Shape:
    """A noise-free series, the noise added to it, and where its growth stops (a plateau's
    end), if it does."""

    name: str
    clean: np.ndarray = field(repr=False)
    noise: np.ndarray = field(repr=False)
    stops: int | None = None

    @property
    def truth(self) -> float:
        """The true growth after warm-up: the level at the last batch less at the first judged."""
        return float(self.clean[-1] - self.clean[WARMUP])


def last_read(n: int) -> int:
    return max(b for b in range(n) if STRIDE.reads(b))


@st.composite
def shapes(draw: st.DrawFn) -> Shape:
    n = draw(st.integers(120, 900))
    total = draw(st.floats(0.1, 4.0)) * BUDGET
    kind = draw(st.sampled_from(["onset", "plateau", "steps", "sawtooth", "noise"]))
    b = np.arange(n, dtype=np.float64)
    stops = None
    if kind == "onset":  # a leak from a batch anywhere it can be seen on the stride
        start = draw(st.integers(0, last_read(n) - 6 * STRIDE.every))  # 7 readings see it
        clean = np.maximum(b - start, 0) * total / (n - 1 - start)
        kind += f" at {start}"
    elif kind == "plateau":  # a cache that fills by a batch and stays
        stops = draw(st.integers(WARMUP + n // 16, n - 1))
        clean = np.minimum(b, stops) * total / stops
    elif kind == "steps":  # a leak in a few large pieces
        seen = last_read(n) - max(n // 16, 2 * STRIDE.every)  # not within the last window
        at = draw(st.lists(st.integers(WARMUP + n // 16, seen), min_size=2, max_size=8))
        clean = sum((b >= a) * (total / len(at)) for a in at)
        stops = max(at)
        kind += f" at {sorted(at)}"
    elif kind == "sawtooth":  # a buffer flushed when full: bounded, never a leak
        every = draw(st.integers(8, n // 2))
        clean = (b % every) * (draw(st.floats(0.05, 0.7)) * BUDGET / every)
        kind += f" every {every}"
    else:
        clean = np.zeros(n)
    sigma = draw(st.sampled_from([0.0, 500.0, 4000.0]))
    noise = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).normal(0, sigma, n)
    name = f"{kind}, {n} batches, {total / BUDGET:.2f}x budget, noise {sigma:g}"
    return Shape(name, 1_000 * MB + clean, noise, stops)


def clear(shape: Shape) -> bool:
    """Whether the shape's verdict is clear: its growth clear of the budget and, for a cache,
    its end clear of where a plateau begins to count (see ``harness._rules.fit``) by two
    strides, the most a stride moves where a piece is seen to end."""
    if BUDGET * 0.8 < shape.truth < BUDGET * 1.25:
        return False
    if shape.stops is None:
        return True
    n = len(shape.clean)
    flat, grew = n - 1 - shape.stops, shape.stops - WARMUP
    return abs(flat - max(PLATEAU, grew)) > 2 * STRIDE.every


def outcome(verdict) -> tuple[str, list[str]]:
    """The verdict's status and what blocks it (a warning may be found in one reading and not
    the other where its trend is near the test's threshold)."""
    return verdict.status, sorted(f.kind for f in verdict.findings if f.blocking)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(shapes())
def test_read_on_the_stride_or_at_every_batch_the_verdict_is_the_same(shape):
    assume(clear(shape))
    values = shape.clean + shape.noise
    every, stride = (judge(samples(values, strided=s), RULES) for s in (False, True))
    assert outcome(every) == outcome(stride)
    for verdict in (every, stride):
        (stats,) = verdict.phases
        if shape.name.startswith("sawtooth"):  # bounded: read within its teeth, never a leak
            assert stats.growth < 0.8 * BUDGET
        elif shape.truth >= BUDGET * 0.8:
            assert stats.growth == pytest.approx(shape.truth, rel=0.2)
        else:
            assert abs(stats.growth - shape.truth) < 0.2 * BUDGET


# -- batches out of order ----------------------------------------------------------------------


def leak_series(n: int, *, onset: int = 0, factor: float = 3.0) -> np.ndarray:
    """A leak of ``factor`` times the budget from batch ``onset`` of ``n``."""
    b = np.arange(n, dtype=np.float64)
    return 1_000 * MB + np.maximum(b - onset, 0) * factor * BUDGET / (n - 1 - onset)


def numbered(values: np.ndarray, batches: list[int]) -> list[Sample]:
    """The loop of ``values`` with the batch numbers ``batches``, read at every one."""
    loop = samples(values, strided=False)
    return [
        loop[0],
        *(replace(s, batch=b) for s, b in zip(loop[1:-1], batches, strict=True)),
        loop[-1],
    ]


@pytest.mark.parametrize(
    "order",
    ["shuffled", "reversed", "restarting every 1000"],
)
def test_a_leak_with_batch_numbers_out_of_order_is_fitted_in_the_checkpoints_order(order):
    n = 3000
    batches = {
        "shuffled": np.random.default_rng(0).permutation(n).tolist(),
        "reversed": list(range(n - 1, -1, -1)),
        "restarting every 1000": [b % 1000 for b in range(n)],
    }[order]
    verdict = judge(numbered(leak_series(n), batches), RULES)
    (leak,) = verdict.findings
    assert leak.kind == "leak" and leak.bytes == pytest.approx(3 * BUDGET, rel=0.05)
    assert "batch numbers do not ascend: fitted in the checkpoints' order" in next(
        c.details for c in verdict.checks if c.rule == "max_growth"
    )
    clean = judge(numbered(np.full(n, 1_000 * MB), batches), RULES)
    assert clean.status == "PASS"


def test_a_leak_starting_at_nine_tenths_of_a_long_loop_is_caught_whole():
    n = 5000
    for strided in (False, True):
        verdict = judge(samples(leak_series(n, onset=4500), strided=strided), RULES)
        (leak,) = verdict.findings
        assert leak.bytes == pytest.approx(3 * BUDGET, rel=0.05)
        assert "from batch 4" in leak.message  # the onset, found within a block of batches
        (stats,) = verdict.phases
        assert stats.onset == pytest.approx(4500, abs=n / 64)
        assert stats.slope == pytest.approx(3 * BUDGET / 499, rel=0.1)  # the rate after it


# -- through the plugin, as a user meets them --------------------------------------------------

SHAPES = """
import collections
import functools
import logging
import logging.handlers

import pytest
import torch

pytestmark = pytest.mark.memleak(phase="validation", max_growth="4MB", warmup=5)


def loop(memtrace, batches, step):
    with memtrace.phase("validation", epoch=0):
        for i in range(batches):
            step(i)
            memtrace.checkpoint("VALIDATION_BATCH", batch=i)


def test_a_cache_filled_in_the_first_32_batches(memtrace):
    cache = {}

    def step(i):
        if i < 32:
            cache[i] = torch.ones(25_000)  # 100 KB

    loop(memtrace, 176, step)


def test_an_lru_cache_full_after_30_batches(memtrace):
    @functools.lru_cache(maxsize=30)
    def features(key):
        return torch.ones(18_000)  # 72 KB

    loop(memtrace, 176, lambda i: features(i % 30))


def test_a_log_buffer_flushed_at_capacity(memtrace):
    handler = logging.handlers.MemoryHandler(
        capacity=48, flushLevel=logging.CRITICAL + 1, target=logging.NullHandler()
    )
    log = logging.getLogger("shapes.buffer")
    log.addHandler(handler)
    log.propagate = False

    def step(i):
        log.warning("batch %d %s", i, torch.ones(10_000))  # the record keeps its 40 KB tensor

    try:
        loop(memtrace, 176, step)
    finally:
        log.removeHandler(handler)


def test_a_bounded_window_of_16(memtrace):
    window = collections.deque(maxlen=16)
    loop(memtrace, 176, lambda i: window.append(torch.ones(128_000)))  # 512 KB each


def test_a_leak_from_batch_400_of_704(memtrace):
    kept = []

    def step(i):
        if i >= 400:
            kept.append(torch.ones(3_950))  # 15.8 KB: 1.2x the budget by the end

    loop(memtrace, 704, step)
"""


def test_caches_windows_and_a_late_leak_get_their_verdicts_through_the_plugin(pytester):
    pytester.makepyfile(test_shapes=SHAPES)
    result = pytester.runpytest("-p", "no:randomly", "--memreport=out")
    result.assert_outcomes(passed=4, failed=1)
    verdicts = {
        path.name.split("__")[1].split("-")[0]: json.loads(path.read_text())
        for path in (pytester.path / "out").glob("*.json")
        if "__" in path.name
    }
    window = verdicts["test_a_bounded_window_of_16"]
    assert [f["kind"] for f in window["findings"]] == ["cache"]
    assert "bounded cache in validation epoch 0: grew" in window["findings"][0]["message"]
    for name in ("cache_filled_in_the_first_32_batches", "lru_cache_full", "log_buffer"):
        (verdict,) = [v for k, v in verdicts.items() if name in k]
        assert verdict["status"] == "PASS" and verdict["phases"][0]["growth"] < 3 * MB
    late = verdicts["test_a_leak_from_batch_400_of_704"]
    (leak,) = late["findings"]
    assert leak["bytes"] == pytest.approx(1.2 * BUDGET, rel=0.2)
    assert late["phases"][0]["onset"] == pytest.approx(400, abs=704 / 64)
    result.stdout.fnmatch_lines(["*leak in validation epoch 0 from batch 39?: +1[56].?KiB/batch*"])
    report = next((pytester.path / "out").glob("*batch_400*.md")).read_text()
    assert "leak from batch 39" in report  # marked in the profile and the chart's caption

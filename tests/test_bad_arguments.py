"""Every argument a public function refuses raises :class:`harness._core.errors.BadArgument`: one
error for API misuse, a ``TypeError`` at the call and bad input (exit 2) for every front end."""

import pytest

from harness import Recorder
from harness._attribution.holders import attribute
from harness._core.errors import BadArgument, BadInput
from harness._core.identity import check_rank, check_world_size
from harness._core.labels import given_event
from harness._core.naming import check_file_name
from harness._core.stats import theil_sen
from harness._measure.sample import column
from harness._rules.child_growth import growth_kind
from harness._rules.registry import register_rule
from harness._verdict.model import Status


def _checkpoint(**given):
    with Recorder("cpu", children=False) as rec:
        rec.checkpoint(**given)


REFUSED = {
    "recorder attribute": lambda: Recorder("cpu", attribute=1),
    "recorder children": lambda: Recorder("cpu", children="yes"),
    "recorder config": lambda: Recorder("cpu", config=[1, 2]),
    "checkpoint label": lambda: _checkpoint(label=3),
    "checkpoint batch": lambda: _checkpoint(label="x", batch="1"),
    "checkpoint note": lambda: _checkpoint(label="x", note=b"n"),
    "checkpoint event": lambda: given_event("x", "bogus"),
    "rule name": lambda: register_rule("1 rule", lambda ctx: []),
    "rule scope": lambda: register_rule("r", lambda ctx: [], scope="epoch"),
    "rule callable": lambda: register_rule("r", 3),
    "file name": lambda: check_file_name(3),
    "world size": lambda: check_world_size("2"),
    "rank": lambda: check_rank(1.0, 2),
    "column kind": lambda: column("bytes", "a size"),
    "holder depth": lambda: attribute(max_depth=0),
    "series lengths": lambda: theil_sen([1, 2, 3], [1, 2]),
    "growth kind series": lambda: growth_kind([1, 2], [1]),
    "worst of nothing": lambda: Status.worst([]),
}


@pytest.mark.parametrize("call", REFUSED.values(), ids=REFUSED.keys())
def test_a_refused_argument_raises_bad_argument(call):
    with pytest.raises(BadArgument) as refused:
        call()
    assert isinstance(refused.value, TypeError) and isinstance(refused.value, BadInput)
    assert str(refused.value) and "\n" not in str(refused.value)

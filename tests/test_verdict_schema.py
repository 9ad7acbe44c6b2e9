"""The verdict document's one schema: derived from the verdict's dataclasses where it can be,
declared beside them where it cannot, and held to both."""

from dataclasses import dataclass, fields

import pytest

from harness._attribution.holders import Holder
from harness._core.errors import BadInput
from harness._verdict.model import Evidence, Finding, Kind
from harness._verdict.schema import FINDING, HOLDER, check_finding, of_dataclass


def test_the_holder_entries_declare_every_field_a_holder_has():
    assert set(HOLDER.fields) == {f.name for f in fields(Holder)} | {"rank"}


def test_a_finding_is_checked_by_every_field_its_dataclass_declares():
    assert list(FINDING.fields) == [f.name for f in fields(Finding)]
    assert FINDING.required == ("kind", "phase", "epoch", "bytes", "message")


def test_a_field_added_to_a_dataclass_is_checked_without_a_line_more():
    @dataclass
    class Grown:
        kind: Kind
        evidence: tuple[Evidence, ...] = ()
        share: float | None = None

    schema = of_dataclass(Grown)
    schema({"kind": "leak", "share": 0.5}, "grown")
    for value, problem in (
        ({"kind": "leak", "share": "half"}, "grown.share: expected a finite number, got 'half'"),
        ({"kind": "spill"}, "grown.kind: expected one of leak, peak"),
        ({"kind": "leak", "evidence": [{"index": 1}]}, "grown.evidence[0]: missing 'label'"),
        ({"share": 1.0}, "grown: missing 'kind'"),
    ):
        with pytest.raises(BadInput, match="^" + problem.replace("[", r"\[")):
            schema(value, "grown")


def test_every_finding_a_rule_can_make_passes_and_a_bad_one_is_named():
    check_finding(Finding(Kind.LEAK, "validation", 0, 4096, "grew", 12.5))
    bad = Finding(Kind.LEAK, "validation", 0, 4096, "grew")
    object.__setattr__(bad, "epoch", "0")  # past the check its constructor makes
    with pytest.raises(BadInput, match=r"finding\.epoch: expected a whole number, got '0'"):
        check_finding(bad)

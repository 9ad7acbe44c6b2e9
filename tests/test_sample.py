import json

import pytest

from harness._measure.sample import Sample


def test_round_trip_through_json():
    s = Sample("VALIDATION_BATCH", "validation", 0, 3, 12.5, {"allocated": 10, "peak": None})
    back = Sample.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back == s
    assert back.get("peak") is None and back.get("allocated") == 10


def test_from_dict_ignores_unknown_and_rejects_missing_label():
    assert Sample.from_dict({"label": "A", "future_field": 1}).label == "A"
    with pytest.raises(ValueError, match="label"):
        Sample.from_dict({"phase": "x"})

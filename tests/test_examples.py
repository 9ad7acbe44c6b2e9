"""``reports/examples/`` is what the current renderer makes of its committed timelines: each
report and verdict there is compared with the ones ``leakgate report`` makes now (``nox -s
examples`` makes them again)."""

import re
import shutil
from pathlib import Path

import pytest

from harness._frontends.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "reports" / "examples"
TIMELINES = sorted(EXAMPLES.glob("*.jsonl"))
TIME = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d(:\d\d(\.\d+)?)?( UTC|Z)?")


def times_aside(text):
    return TIME.sub("<time>", text)


def test_the_examples_are_the_clean_job_and_the_incident():
    assert [p.stem for p in TIMELINES] == [
        "tft-train-clean",
        "tft-train-val-attention-cache+val-batch-32",
    ]


@pytest.mark.parametrize("timeline", TIMELINES, ids=lambda path: path.stem)
def test_a_committed_example_is_what_the_renderer_makes_of_its_timeline(timeline, tmp_path):
    copy = Path(shutil.copy(timeline, tmp_path))
    assert main(["report", str(copy), "-o", str(copy.with_suffix(".md"))]) in (0, 1)
    for suffix in (".md", ".json"):
        made = copy.with_suffix(suffix).read_text()
        committed = timeline.with_suffix(suffix).read_text()
        assert times_aside(made) == times_aside(committed), (
            f"{timeline.with_suffix(suffix).name} is not what the renderer makes of its "
            "timeline: run nox -s examples"
        )

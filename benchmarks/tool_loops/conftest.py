"""Times each test's whole protocol (set-up, call and tear-down, with every plugin hook run in
them) and each phase's own duration (pytest's, which leaves out the report hooks: leakgate's
verdict), and records whether it failed, into the JSON file named by ``LOOP_RESULTS``."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import pytest

RESULTS: dict[str, dict[str, object]] = {}


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    started = time.perf_counter()
    yield
    RESULTS.setdefault(item.callspec.id, {})["seconds"] = time.perf_counter() - started


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    kind = report.nodeid.rsplit("[", 1)[-1].rstrip("]")
    result = RESULTS.setdefault(kind, {})
    result["failed"] = bool(result.get("failed")) or report.failed
    result[report.when] = report.duration


def pytest_sessionfinish() -> None:
    path = os.environ.get("LOOP_RESULTS")
    if path:
        with open(path, "w") as out:
            json.dump(RESULTS, out)

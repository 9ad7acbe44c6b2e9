"""Distributed runs (``torch.distributed``, DDP under ``torchrun``): one timeline per rank,
judged as one run. This module gathers the public names from the rooms that own them:

- which rank a process is (:func:`rank_info`, :class:`RankInfo`: :mod:`harness._core.identity`) and
  its timeline's name (:func:`rank_timeline`, :func:`run_name`: :mod:`harness._core.naming`);
- merging the ranks into one verdict and report (:func:`finish_distributed`,
  :func:`merge_timelines`, :func:`finish_ranks`, :func:`rank_part`: :mod:`harness._results.merge`);
- a test body on N local ranks (:func:`run_ranks`, and :func:`max_local_ranks`, the most this
  machine runs: :mod:`harness._frontends.spawn`).

``python -m harness._frontends.distributed TIMELINE...`` is ``leakgate merge TIMELINE...``. Nothing
in the harness imports this module: it is for users.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from harness._core.identity import RankInfo, rank_info
from harness._core.naming import rank_timeline, run_name
from harness._frontends.spawn import max_local_ranks, quiet_flight_recorder, run_ranks
from harness._results.merge import (
    finish_distributed,
    finish_ranks,
    gate_problems,
    merge_timelines,
    merge_verdicts,
    rank_part,
)

__all__ = [
    "RankInfo",
    "finish_distributed",
    "finish_ranks",
    "gate_problems",
    "max_local_ranks",
    "merge_main",
    "merge_timelines",
    "merge_verdicts",
    "quiet_flight_recorder",
    "rank_info",
    "rank_part",
    "rank_timeline",
    "run_name",
    "run_ranks",
]


def merge_main(argv: Sequence[str] | None = None) -> int:
    """``python -m harness._frontends.distributed TIMELINE...``: ``leakgate merge`` under its old
    name."""
    from harness._frontends.cli import main as leakgate

    return leakgate(["merge", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(merge_main())

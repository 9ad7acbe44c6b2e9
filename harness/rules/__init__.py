"""Judging a timeline: :func:`~harness.rules.judging.judge` runs every registered rule
(:mod:`~harness.rules.registry`) over one statistics pass (:mod:`~harness.rules.context`); the
built-in rules live in :mod:`~harness.rules.loop`, :mod:`~harness.rules.per_run`,
:mod:`~harness.rules.child_growth`, :mod:`~harness.rules.saturation` and
:mod:`~harness.rules.rank_outlier`."""

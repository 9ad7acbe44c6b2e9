"""Judging a timeline: :func:`~harness._rules.judging.judge` runs every registered rule
(:mod:`~harness._rules.registry`) over one statistics pass (:mod:`~harness._rules.context`); the
built-in rules live in :mod:`~harness._rules.loop`, :mod:`~harness._rules.per_run`,
:mod:`~harness._rules.child_growth`, :mod:`~harness._rules.saturation` and
:mod:`~harness._rules.rank_outlier`."""

"""The markdown report of a run, and the directory's index of runs.

:func:`~harness.report.sections.render_report` turns a :class:`~harness.report.run.Run`
(timeline header, samples, verdict, attribution) into the report; its sections live in
:mod:`~harness.report.sections` (the frame), :mod:`~harness.report.profile`,
:mod:`~harness.report.chart` and :mod:`~harness.report.analysis` (one renderer each for a run
or a merged run's ranks, a single run being a list of one) and :mod:`~harness.report.issues`
(findings with their cause and fix). :mod:`~harness.report.index` renders ``index.md`` from
saved verdicts. Escaping is :mod:`harness.core.markdown`'s, advice :mod:`harness.report.advice`'s.
Each name is imported from the module that defines it.
"""

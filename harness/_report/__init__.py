"""The markdown report of a run, and the directory's index of runs.

:func:`~harness._report.sections.render_report` turns a :class:`~harness._report.run.Run`
(timeline header, samples, verdict, attribution) into the report; its sections live in
:mod:`~harness._report.sections` (the frame), :mod:`~harness._report.profile`,
:mod:`~harness._report.chart` and :mod:`~harness._report.analysis` (one renderer each for a run
or a merged run's ranks, a single run being a list of one) and :mod:`~harness._report.issues`
(findings with their cause and fix). :mod:`~harness._report.index` renders ``index.md`` from
saved verdicts. Escaping is :mod:`harness._core.markdown`'s, advice :mod:`harness._report.advice`'s.
Each name is imported from the module that defines it.
"""

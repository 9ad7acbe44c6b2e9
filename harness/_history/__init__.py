"""Memory across commits: a history of runs (:mod:`~harness._history.archive`), read as series
(:mod:`~harness._history.series`), judged for creep and steps (:mod:`~harness._history.creep`),
shown as one page (:mod:`~harness._history.page`), and the commit that made a test fail found
(:mod:`~harness._history.bisect`). See ``docs/history.md``."""

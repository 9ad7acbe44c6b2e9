"""Memory across commits: a history of runs (:mod:`~harness.history.archive`), read as series
(:mod:`~harness.history.series`), judged for creep and steps (:mod:`~harness.history.creep`),
shown as one page (:mod:`~harness.history.page`), and the commit that made a test fail found
(:mod:`~harness.history.bisect`). See ``docs/history.md``."""

"""Recording memory inside other training frameworks.

Each integration is a module of its own that imports its framework; this package imports none
of them, so the core works without any framework installed. See
:mod:`harness.integrations.lightning` (the ``leakgate[lightning]`` extra).
"""

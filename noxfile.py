"""Sessions: ``tests`` (the whole suite), ``lint``.

The torch build is chosen by ``LEAKGATE_TORCH`` (a pip requirement, default ``torch==2.13.0``):
on Linux x86_64, PyPI's wheel of that release is a CUDA build; a machine with a local CPU
wheel picks that up. Set ``LEAKGATE_TORCH=""`` to keep whatever the environment resolves.
"""

from __future__ import annotations

import os

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["tests", "lint"]

TORCH = os.environ.get("LEAKGATE_TORCH", "torch==2.13.0")


def install(session: nox.Session, extra: str) -> None:
    """Install torch as chosen, then the project with one extra."""
    if TORCH:
        session.install(TORCH)
    session.install("-e", f".[{extra}]")


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite (arguments after ``--`` go to pytest)."""
    install(session, "test")
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and format check."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")

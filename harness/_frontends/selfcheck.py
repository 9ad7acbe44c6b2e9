"""``python -m harness._frontends.selfcheck [--cuda]``: prove the measuring path on this machine, in
minutes.

The CPU half (what CI runs): a known allocation read by the CPU probe, a leaking loop and its
clean twin judged, the leak's holder named, and the incident (the attention cache and the 32x
validation batch) replayed on a small file through ``python -m tft.train``. The CUDA half
(``--cuda``): the CUDA probe's readings against ``torch.cuda.memory_stats`` and NVML for a
known allocation, the leak and its twin judged on CUDA, the holder named with its allocation
site, the incident replayed at an emulated CUDA capacity (twice a clean run's rise above its
start, where validation must run out of memory), and a memory snapshot written. Without a CUDA
device the CUDA half prints ``skipped: no CUDA device``.

One line per check (``ok`` or ``FAILED``, with what it measured); the exit code is 0 when every
check ran passed, 1 naming the checks that failed, or 1 with one line on stderr when stdout
cannot take the lines (a full disk, ``> /dev/full``). A selfcheck is one process, whatever rank
variables it inherits (a shell inside a ``torchrun`` job): it drops them first, so the training
command it runs is one process too. Under a memory tracer started outside leakgate
(``PYTHONTRACEMALLOC``, memray) holder searches step aside, and the holder check says so instead
of naming the holder.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness._attribution.quiet import memory_tracer
from harness._core.units import format_size
from harness._measure.probes import probe_type
from harness._recorder import Recorder
from harness._results.cuda_snapshot import dump_snapshot, record_history
from harness._rules.judging import judge
from harness._timeline.jsonl import read_timeline
from harness._verdict.model import Kind, Status
from harness._verdict.options import Rules

KNOWN = 64 * 2**20  # the known allocation: 64 MiB
BATCHES = 60
PER_BATCH = 64 * 1024  # bytes kept per batch by the leaking twin: 3.75 MiB in all
RULES = Rules(phase=("validation",), max_growth="1MiB", warmup=5)
CUDA_BLOCK = 2 * 2**20  # the caching allocator's large-segment rounding
INCIDENT = ("val-attention-cache", "val-batch-32")
LAUNCHER = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
)
"""The variables a launcher (``torchrun``) sets that make a process one rank of several; with
``TORCHELASTIC_*``, a selfcheck drops them."""


class CheckFailed(AssertionError):
    """A check's measurement disagreed with what it expects; the message says how."""


@dataclass(frozen=True)
class DeviceCheck:
    name: str
    run: Callable[[], str]


def require(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def cpu_probe_reads_a_known_allocation() -> str:
    with Recorder("cpu") as rec:
        before = rec.checkpoint("before", collect=True)
        held = torch.ones(KNOWN // 4)
        after = rec.checkpoint("after", collect=True)
        seen = (after.get("allocated") or 0) - (before.get("allocated") or 0)
        del held
    # other threads and the collector may free or take a few KiB between the two reads
    require(abs(seen - KNOWN) <= 2**20, f"allocated rose by {seen} B for {KNOWN} B")
    return f"allocated +{format_size(seen)} for a {format_size(KNOWN)} tensor"


class _Outputs:
    """What the leaking loop keeps: its holder is ``_Outputs.kept``."""

    def __init__(self) -> None:
        self.kept: list[torch.Tensor] = []


def loop(device: str, *, keep: bool) -> Recorder:
    """A validation loop of :data:`BATCHES` batches that keeps each batch's output or not."""
    outputs = _Outputs()
    with Recorder(device, attribute=True) as rec, rec.phase("validation", epoch=0):
        for batch in range(BATCHES):
            out = torch.ones(PER_BATCH // 4, device=device) * 2
            if keep:
                outputs.kept.append(out)
            del out
            rec.checkpoint("VALIDATION_BATCH", batch=batch)
    return rec


def leak_and_twin(device: str, *, sites: bool) -> str:
    """The leaking loop fails as a validation leak, its twin passes, and the holder is named
    (on CUDA with the line that allocated what it holds)."""
    leaking, clean = loop(device, keep=True), loop(device, keep=False)
    leak, twin = judge(leaking.samples, RULES), judge(clean.samples, RULES)
    kinds = {(f.kind, f.phase) for f in leak.findings}
    require(
        leak.status == Status.FAIL and (Kind.LEAK, "validation") in kinds,
        f"leak judged {leak.status}",
    )
    require(
        twin.status == Status.PASS,
        f"clean twin judged {twin.status}: {twin.error or twin.findings}",
    )
    found = [h.path for h in leaking.holders]
    tracer = memory_tracer()
    if tracer is not None:  # a search steps aside under another memory tracer, and says why
        aside = f"<not searched: {tracer}>"
        require(found == [aside], f"{tracer}, yet the holders found are {found}")
        return f"leak FAIL, twin PASS, holder not searched: {tracer} (started outside leakgate)"
    holders = [h for h in leaking.holders if h.path.endswith("kept")]
    require(bool(holders), f"no holder named kept, found {found}")
    holder = holders[0]
    text = f"leak FAIL, twin PASS, held by {holder.path} ({format_size(holder.bytes)})"
    if sites:
        here = Path(__file__).name
        require(
            any(site.split(":")[0].endswith(here) for site in holder.sites),
            f"allocation sites {list(holder.sites)} do not name {here}",
        )
        text += f" allocated at {holder.sites[0]}"
    return text


def incident_replay(device: str, *, at_capacity: bool) -> str:
    """The incident's two validation faults, replayed on a small file by the training command:
    it must exit 1 with a FAIL verdict naming validation. ``at_capacity``: first a clean run,
    which must pass, then the faulty run on an emulated device with twice the clean run's rise
    as room above its start, where validation must run out of memory."""
    with tempfile.TemporaryDirectory(prefix="leakgate-selfcheck-") as name:
        folder = Path(name)
        bars = folder / "bars.parquet"
        _command("tft.data", "synth", "--out", str(bars), "--rows", "2000")
        capacity = None
        if at_capacity:
            code, clean = _train(bars, folder, device, [], None)
            require(code == 0 and clean["status"] == Status.PASS, f"clean run: exit {code}")
            readings = read_timeline(folder / "tft-train-clean.jsonl").samples
            level = probe_type(device).capacity_metric
            start = readings[0].get(level) or 0
            highest = max(max(s.get(level) or 0, s.get("peak") or 0) for s in readings)
            capacity = str(start + 2 * (highest - start))
        code, found = _train(bars, folder, device, list(INCIDENT), capacity)
    kinds = sorted({f["kind"] for f in found["findings"] if f["phase"] == "validation"})
    require(code == 1 and found["status"] == Status.FAIL, f"exit {code}, verdict {found['status']}")
    require(bool(kinds), "no validation finding")
    if capacity is not None:
        at = format_size(int(capacity))
        require(Kind.OOM in kinds, f"no OOM at {at}: validation findings {kinds}")
        return f"clean PASS; faults exit 1, FAIL at {at}: validation {', '.join(kinds)}"
    return f"exit 1, FAIL: validation {', '.join(kinds)}"


def _train(
    bars: Path, folder: Path, device: str, faults: list[str], capacity: str | None
) -> tuple[int, dict[str, Any]]:
    """``python -m tft.train`` for one epoch on ``bars``: its exit code and verdict."""
    argv = ["--parquet-file", str(bars), "--epochs", "1", "--device", device]
    argv += [arg for fault in faults for arg in ("--inject-fault", fault)]
    argv += ["--memreport", str(folder)] + (["--capacity", capacity] if capacity else [])
    code = _command("tft.train", *argv, codes=(0, 1))
    verdict = folder / f"tft-train-{'+'.join(faults) or 'clean'}.json"
    return code, json.loads(verdict.read_text())


def cuda_probe_agrees() -> str:
    """The CUDA probe's reading of a known allocation against ``memory_stats`` and NVML."""
    from harness._measure.probes import CudaProbe

    probe = CudaProbe()
    torch.cuda.synchronize()
    before = probe.sample()
    held = torch.empty(KNOWN, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    after = probe.sample()
    stats = torch.cuda.memory_stats()
    seen = (after["allocated"] or 0) - (before["allocated"] or 0)
    require(abs(seen - KNOWN) <= CUDA_BLOCK, f"allocated rose by {seen} B for {KNOWN} B")
    current = stats["allocated_bytes.all.current"]
    require(after["allocated"] == current, f"allocated {after['allocated']} != stats {current}")
    reserved = stats["reserved_bytes.all.current"]
    require(after["reserved"] == reserved, f"reserved {after['reserved']} != stats {reserved}")
    used = [reading.get("device_used") for reading in (before, after)]
    require(None not in used, f"no NVML reading ({'; '.join(probe.notes) or 'no note'})")
    nvml = (used[1] or 0) - (used[0] or 0)
    grown = (after["reserved"] or 0) - (before["reserved"] or 0)
    require(abs(nvml - grown) <= CUDA_BLOCK, f"NVML rose by {nvml} B, reserved by {grown} B")
    del held
    probe.close()
    return (
        f"allocated +{format_size(seen)} (memory_stats agrees), reserved +{format_size(grown)}, "
        f"NVML +{format_size(nvml)}"
    )


def host_beside_cuda() -> str:
    """A loop on the GPU that moves each output to the host and keeps it there (the usual cure
    for a device's out-of-memory): the device stays level, and the host fails as a leak of its
    own; its twin, which keeps nothing, passes."""
    verdicts = []
    for keep in (True, False):
        outputs = _Outputs()
        with Recorder("cuda") as rec, rec.phase("validation", epoch=0):
            for batch in range(BATCHES):
                out = (torch.ones(PER_BATCH // 4, device="cuda") * 2).cpu()
                if keep:
                    outputs.kept.append(out)
                del out
                rec.checkpoint("VALIDATION_BATCH", batch=batch)
        verdicts.append(judge(rec.samples, RULES))
    leak, twin = verdicts
    on_host = [f for f in leak.findings if f.evidence and f.evidence[0].metric == "host_allocated"]
    require(leak.status == Status.FAIL and bool(on_host), f"host leak judged {leak.status}")
    device = [f for f in leak.findings if f.evidence and f.evidence[0].metric == "allocated"]
    require(not device, f"the device judged to leak: {device[0].message if device else ''}")
    require(twin.status == Status.PASS, f"clean twin judged {twin.status}: {twin.findings}")
    return f"host leak FAIL ({format_size(on_host[0].bytes or 0, signed=True)}), twin PASS"


def snapshot_written() -> str:
    """A snapshot of a known allocation, written and read back."""
    with tempfile.TemporaryDirectory(prefix="leakgate-selfcheck-") as folder:
        path = Path(folder) / "check.snapshot.pickle"
        with record_history():
            held = torch.empty(KNOWN, dtype=torch.uint8, device="cuda")
            dump_snapshot(path)
            del held
        size = path.stat().st_size
        with path.open("rb") as f:
            data = pickle.load(f)
    require(bool(data.get("segments")), "the snapshot has no segments")
    traces = sum(len(t) for t in data.get("device_traces", []))
    require(traces > 0, "the snapshot recorded no allocation history")
    return f"{format_size(size)}, {len(data['segments'])} segments, {traces} trace entries"


def cpu_checks() -> list[DeviceCheck]:
    return [
        DeviceCheck("cpu probe: a known allocation", cpu_probe_reads_a_known_allocation),
        DeviceCheck(
            "cpu: a leak and its clean twin, the holder", lambda: leak_and_twin("cpu", sites=False)
        ),
        DeviceCheck(
            "cpu: the incident replayed", lambda: incident_replay("cpu", at_capacity=False)
        ),
    ]


def cuda_checks() -> list[DeviceCheck]:
    return [
        DeviceCheck("cuda probe: memory_stats and NVML", cuda_probe_agrees),
        DeviceCheck(
            "cuda: a leak and its clean twin, holder and site",
            lambda: leak_and_twin("cuda", sites=True),
        ),
        DeviceCheck(
            "cuda: the incident replayed at a capacity",
            lambda: incident_replay("cuda", at_capacity=True),
        ),
        DeviceCheck("cuda: the host beside the device", host_beside_cuda),
        DeviceCheck("cuda: a memory snapshot", snapshot_written),
    ]


def say(line: str) -> None:
    """Print one line now (``OSError`` when stdout cannot take it)."""
    print(line, flush=True)


def run_checks(checks: Sequence[DeviceCheck], write: Callable[[str], None] = say) -> list[str]:
    """Run each check, one line each; returns the names of those that failed."""
    failed = []
    for check in checks:
        started = time.perf_counter()
        try:
            detail = check.run()
            status = "ok"
        except Exception as exc:
            detail, status = f"{type(exc).__name__}: {exc}".splitlines()[0], "FAILED"
            failed.append(check.name)
        write(f"{status:<6} {check.name}: {detail} ({time.perf_counter() - started:.1f}s)")
    return failed


def selfcheck(argv: Sequence[str] | None = None) -> int:
    """Run the checks, one line each; the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m harness._frontends.selfcheck", description=__doc__
    )
    parser.add_argument("--cuda", action="store_true", help="run the CUDA half too")
    args = parser.parse_args(argv)
    checks = cpu_checks()
    if args.cuda and torch.cuda.is_available():
        checks += cuda_checks()
    failed = run_checks(checks)
    if args.cuda and not torch.cuda.is_available():
        say("cuda half: skipped: no CUDA device")
    if failed:
        say(f"selfcheck: FAILED: {'; '.join(failed)}")
        return 1
    say(f"selfcheck: ok ({len(checks)} checks)")
    return 0


def one_process() -> None:
    """Drop the launcher's variables (:data:`LAUNCHER`) from this process's environment, which
    the training command it runs inherits: a selfcheck never waits for ranks that never come."""
    for name in [*LAUNCHER, *(n for n in os.environ if n.startswith("TORCHELASTIC_"))]:
        os.environ.pop(name, None)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harness._frontends.selfcheck``: :func:`selfcheck` as one process
    (:func:`one_process`), its exit code, or 1 with one line on stderr when stdout cannot be written
    (a check's own errors are its ``FAILED`` line)."""
    one_process()
    try:
        try:
            return selfcheck(argv)
        finally:
            sys.stdout.flush()
    except OSError as exc:
        _drop_stdout()
        with contextlib.suppress(OSError):
            print(f"selfcheck: cannot write to stdout: {exc.strerror or exc}", file=sys.stderr)
        return 1


def _drop_stdout() -> None:
    """Point stdout at ``/dev/null``: what Python still holds for it goes nowhere at exit,
    instead of failing a second time."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _command(module: str, *args: str, codes: Sequence[int] = (0,)) -> int:
    """Run ``python -m module args``; its output is shown only when it exits otherwise."""
    done = subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, check=False
    )
    if done.returncode not in codes:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise CheckFailed(f"python -m {module} exited {done.returncode}: {tail[0]}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())

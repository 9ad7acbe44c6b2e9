"""PyTorch Lightning: record a ``lightning.Trainer``'s loops at the checkpoints ``tft.Trainer``
names, and judge them through the same finishing step as every other entry point.

In a pytest test, hand the callback the ``memtrace`` fixture; the plugin judges the test::

    @pytest.mark.memleak(phase="validation", max_growth="1MB")
    def test_fit(memtrace):
        Trainer(callbacks=[LeakGateCallback(memtrace)]).fit(model, train, val)

In a script, let it make its own recorder and judge the fit when it ends::

    gate = LeakGateCallback(rules=Rules(phase="validation", max_growth="50MB"),
                            directory="reports", raise_on_fail=True)
    Trainer(callbacks=[gate]).fit(model, train, val)  # raises MemoryCheckFailed on a leak

What is recorded, ``[phase, epoch]`` in brackets (``e`` is ``trainer.current_epoch``)::

    setup           SESSION_START, collected                                [session]
    sanity check    VALIDATION_START, VALIDATION_BATCH x n, VALIDATION_END  [sanity_check]
    each epoch      EPOCH_START, TRAIN_BATCH x N, AFTER_TRAINING            [training, e]
    validation      VALIDATION_START, VALIDATION_BATCH x M, VALIDATION_END  [validation, e]
    epoch end       EPOCH_END                                               [epoch, e]
    end of the fit  SESSION_END, collected                                  [session]

``trainer.validate``, ``test`` and ``predict`` record ``VALIDATION_*``, ``TESTING_*`` and
``PREDICTION_*`` in phases ``validation``, ``testing`` and ``prediction``, without an epoch,
framed by ``SESSION_START`` and ``SESSION_END`` (at the stage's teardown). The choices:

- The sanity check is not an epoch: its phase, ``sanity_check``, is one that rules naming their
  phases leave out (``Rules(phase=None)`` judges every phase, this one too).
- Several validation runs in one epoch (``val_check_interval`` < 1) are one group, ``[validation,
  e]``: batches are numbered on from the epoch's previous run, so the series follows time, and
  each run keeps its own START and END. A leak cleared after each run shows as a saw-tooth.
- ``AFTER_TRAINING`` follows the epoch's last training batch: before the epoch-end validation,
  or at the epoch's end when no validation runs then.
- The test loop's phase is ``testing``: ``test`` and ``TEST_START``/``TEST_END`` frame a pytest
  test's window.
- On CPU the module and its optimizer state stay allocated at ``SESSION_END`` (the caller still
  holds them); on CUDA Lightning has moved both to the CPU by then.

Only the ``lightning`` package is supported (``lightning.pytorch``), not ``pytorch_lightning``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch

try:
    import lightning
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "harness.integrations.lightning needs the lightning package: "
        "pip install 'leakgate[lightning]'"
    ) from error

import harness._core.labels as labels
from harness._attribution.phase import PhaseAttribution
from harness._core.errors import BadArgument, as_unwritable
from harness._core.naming import check_file_name, check_path
from harness._core.units import parse_size
from harness._measure.probes import probe_for
from harness._recorder import DeviceOutOfMemory, Recorder
from harness._results.finish import Finished, MemoryCheckFailed, finish_run
from harness._verdict.options import Rules, check_flag

__all__ = ["DEFAULT_RULES", "PHASES", "LeakGateCallback", "MemoryCheckFailed"]


SANITY_CHECK = "sanity_check"
PHASES = {
    "fit": ("training", "validation"),
    "validate": ("validation",),
    "test": ("testing",),
    "predict": ("prediction",),
}
"""The loop phases each ``trainer`` entry point (Lightning's stage) records."""

DEFAULT_RULES = {stage: Rules(phase=phases, max_growth="50MB") for stage, phases in PHASES.items()}
"""What a callback that makes its own recorder judges when it is given no rules."""


class LeakGateCallback(Callback):
    """Records memory at named checkpoints of a Lightning run (see the module's docstring).

    ``recorder``: a :class:`~harness._recorder.Recorder` to record into, such as pytest's
    ``memtrace``; whoever made it judges it, and the callback only records, unless ``rules``
    are given too. Without one the callback makes a recorder for each run (``trainer.fit``,
    ``validate``, ``test`` or ``predict``), reading the device the module runs on (``cpu`` or
    ``cuda:N``), judges the run when it ends, writes the report through
    :func:`harness._results.finish.finish_run` and closes the recorder.

    ``rules``: a :class:`~harness._verdict.options.Rules` or a mapping of its fields; default
    :data:`DEFAULT_RULES` for the run's stage. ``directory``: where ``<name>.md``, ``.json`` and
    the timeline ``.jsonl`` go (nothing is written without it, unless ``timeline`` is given).
    ``timeline``: the JSONL timeline's path. Runs other than ``fit`` add ``-<stage>`` to
    ``name``, and each rank of a distributed run ``-rank<N>``. ``raise_on_fail``: raise
    :class:`MemoryCheckFailed` from ``on_fit_end`` (or the stage's teardown) when the verdict
    is not PASS, which stops the script. A report, verdict or timeline that cannot be written
    is printed as ``not saved: cannot write ...`` under the verdict and raised as
    :class:`~harness._core.errors.UnwritableReport` with ``raise_on_fail`` (else warned about, a
    ``RuntimeWarning``); a timeline that cannot be created stops the run at its setup with
    that error. ``name`` must be a plain file name
    (:func:`harness._core.naming.check_file_name`). ``attribute``, ``capacity``: as for
    ``Recorder``, for the recorder the callback makes (``attribute`` is on too when the rules'
    is). Every argument refused raises :class:`~harness._core.errors.BadArgument` here, before
    any run.

    After a judged run, :attr:`finished` holds it; :attr:`recorder` is the last recorder used.
    """

    def __init__(
        self,
        recorder: Recorder | None = None,
        *,
        rules: Rules | Mapping[str, Any] | None = None,
        directory: str | os.PathLike[str] | None = None,
        timeline: str | os.PathLike[str] | None = None,
        name: str = "lightning",
        title: str | None = None,
        raise_on_fail: bool = False,
        attribute: bool = False,
        capacity: int | str | None = None,
    ) -> None:
        if recorder is not None and not isinstance(recorder, Recorder):
            raise BadArgument(f"recorder: expected a Recorder or None, got {recorder!r}")
        if rules is not None and not isinstance(rules, Rules):
            rules = Rules.from_dict(rules)
        if recorder is not None and (timeline is not None or attribute or capacity is not None):
            raise BadArgument(
                "timeline, attribute and capacity configure the recorder the callback makes; "
                "set them on the recorder given instead",
                field="recorder",
            )
        self.judges = recorder is None or rules is not None
        if check_flag(raise_on_fail, where="raise_on_fail") and not self.judges:
            raise BadArgument(
                "needs a verdict: give rules, or let the callback make its recorder",
                field="raise_on_fail",
            )
        check_file_name(name)
        if title is not None and not isinstance(title, str):
            raise BadArgument(f"title: expected text or None, got {type(title).__name__}")
        self.rules = rules
        self.directory = (
            None if directory is None else check_path(directory, "directory", folder=True)
        )
        self.timeline = None if timeline is None else check_path(timeline, "timeline")
        self.name = name
        self.title = title
        self.raise_on_fail = raise_on_fail
        self.attribute = check_flag(attribute, where="attribute")
        self.capacity = None if capacity is None else parse_size(capacity, what="capacity")
        self.finished: Finished | None = None
        self._given = recorder
        self._recorder = recorder
        self._stage: str | None = None
        self._session = name
        self._sanity = False
        self._trained: int | None = None
        self._counts: dict[tuple[str, int | None], int] = {}
        self._module = "LightningModule"

    @property
    def recorder(self) -> Recorder | None:
        """The recorder of the current run, else of the last one (None before any run)."""
        return self._recorder

    # -- the session ------------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        device = trainer.strategy.root_device
        self._session = self._name(trainer, stage)
        self._module = type(pl_module).__qualname__
        if self._given is None:
            self._recorder = self._make_recorder(trainer, pl_module, stage, device)
        else:
            _check_probe(self._given, device)
        self._stage, self._sanity, self._trained = stage, False, None
        self._counts.clear()
        self._mark(labels.SESSION_START, "session", None, collect=True)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._end()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._end()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._end(exception)

    def _end(self, error: BaseException | None = None) -> None:
        """Record the collected ``SESSION_END`` and, when the callback judges, finish the run."""
        stage, recorder = self._stage, self._recorder
        if stage is None or recorder is None:
            return
        self._stage = None
        note = None if error is None else f"session ended by {type(error).__name__}"
        try:
            if not recorder.closed:
                recorder.checkpoint(labels.SESSION_END, phase="session", collect=True, note=note)
        except DeviceOutOfMemory as exceeded:
            error = error or exceeded
        if not self.judges:
            return
        try:
            finished = finish_run(
                recorder,
                self._rules(stage),
                name=self._session,
                error=error,
                directory=self.directory,
                title=self.title or f"Lightning {stage}: {self._module}",
            )
        finally:
            if self._given is None:
                recorder.close()
        self.finished = finished
        lines = finished.lines()
        unsaved = None
        if finished.write_error is not None:
            unsaved = as_unwritable(finished.write_error, self.directory)
            lines.append(f"  not saved: {unsaved}")
        elif "md" in finished.paths:
            lines.append(f"  report: {finished.paths['md']}")
        print("\n".join(lines), flush=True)  # pass or fail, as the pytest summary shows it
        if self.raise_on_fail and error is None and not finished.verdict.passed:
            raise MemoryCheckFailed(finished)
        if unsaved is not None:
            if self.raise_on_fail and error is None:
                raise unsaved
            warnings.warn(f"leakgate: the verdict was not saved: {unsaved}", RuntimeWarning, 2)

    def _make_recorder(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        stage: str,
        device: torch.device,
    ) -> Recorder:
        timeline = self.timeline
        suffix = self._session[len(self.name) :]
        if timeline is not None and suffix:
            timeline = timeline.with_name(f"{timeline.stem}{suffix}{timeline.suffix}")
        elif timeline is None and self.directory is not None:
            timeline = self.directory / f"{self._session}.jsonl"
        hparams = getattr(pl_module, "hparams", None)
        rules = self._rules(stage)
        if self.attribute:
            rules = replace(rules, attribute=True)
        try:
            return Recorder(
                probe_for(device),
                capacity=self.capacity,
                timeline=timeline,
                config=dict(hparams) if isinstance(hparams, Mapping) and hparams else None,
                meta={
                    "integration": "lightning",
                    "lightning": lightning.__version__,
                    "stage": stage,
                    "module": type(pl_module).__qualname__,
                    "device": str(device),
                    "rank": trainer.global_rank,
                    "world_size": trainer.world_size,
                },
                attribute=PhaseAttribution.for_rules(rules),
                rules=rules,
            )
        except OSError as exc:  # the timeline cannot be created: the fit stops before it starts
            raise as_unwritable(exc, timeline) from None

    def _rules(self, stage: str) -> Rules:
        if self.rules is not None:
            return self.rules
        return DEFAULT_RULES.get(stage, DEFAULT_RULES["fit"])

    def _name(self, trainer: pl.Trainer, stage: str) -> str:
        name = self.name if stage == "fit" else f"{self.name}-{stage}"
        return f"{name}-rank{trainer.global_rank}" if trainer.world_size > 1 else name

    # -- training ---------------------------------------------------------------------------

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mark("EPOCH_START", "training", trainer.current_epoch)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self._mark("TRAIN_BATCH", "training", trainer.current_epoch, batch_idx)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._after_training(trainer.current_epoch)
        self._mark(labels.EPOCH_END, "epoch", trainer.current_epoch)

    def _after_training(self, epoch: int) -> None:
        """``AFTER_TRAINING``, once per epoch."""
        if self._trained != epoch:
            self._trained = epoch
            self._mark("AFTER_TRAINING", "training", epoch)

    # -- validation -------------------------------------------------------------------------

    def on_sanity_check_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._sanity = True

    def on_sanity_check_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._sanity = False

    def _validation(self, trainer: pl.Trainer) -> tuple[str, int | None]:
        if self._sanity:
            return SANITY_CHECK, None
        return "validation", trainer.current_epoch if self._stage == "fit" else None

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        phase, epoch = self._validation(trainer)
        if epoch is not None and _training_done(trainer):
            self._after_training(epoch)
        self._mark("VALIDATION_START", phase, epoch)

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._batch("VALIDATION_BATCH", *self._validation(trainer))

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mark("VALIDATION_END", *self._validation(trainer))

    # -- test and predict -------------------------------------------------------------------

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mark("TESTING_START", "testing", None)

    def on_test_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._batch("TESTING_BATCH", "testing", None)

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mark("TESTING_END", "testing", None)

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mark("PREDICTION_START", "prediction", None)

    def on_predict_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._batch("PREDICTION_BATCH", "prediction", None)

    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mark("PREDICTION_END", "prediction", None)

    # -- recording --------------------------------------------------------------------------

    def _batch(self, label: str, phase: str, epoch: int | None) -> None:
        """A loop batch, numbered on across the loop's runs and dataloaders in this group."""
        key = (phase, epoch)
        batch = self._counts.get(key, 0)
        self._counts[key] = batch + 1
        self._mark(label, phase, epoch, batch)

    def _mark(
        self,
        label: str,
        phase: str,
        epoch: int | None,
        batch: int | None = None,
        *,
        collect: bool = False,
    ) -> None:
        if self._stage is not None and self._recorder is not None:
            self._recorder.checkpoint(label, phase=phase, epoch=epoch, batch=batch, collect=collect)


def _check_probe(recorder: Recorder, device: torch.device) -> None:
    """Warn when a given recorder reads another device than the one the module runs on."""
    expected = probe_for(device)
    if recorder.probe.name != expected:
        warnings.warn(
            f"leakgate: the recorder reads {recorder.probe.name}, but the module runs on "
            f"{device}: make it with Recorder({expected!r})",
            RuntimeWarning,
            stacklevel=3,
        )


def _training_done(trainer: pl.Trainer) -> bool:
    """Whether the epoch's training batches have all run (the validation about to start is
    the epoch-end one)."""
    progress = trainer.fit_loop.epoch_loop.batch_progress
    return bool(progress.is_last_batch) or progress.current.ready >= trainer.num_training_batches

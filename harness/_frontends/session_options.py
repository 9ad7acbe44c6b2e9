"""The pytest session's own options, checked where they enter, before any test runs.

``--memreport`` (the report folder), ``--memreport-storage`` (where named baselines are kept),
``--memreport-save`` and ``--memreport-compare`` (a baseline) and ``--memreport-json`` (the
summary) are each a path the system can open (:func:`~harness._core.naming.check_path`) of the kind
they must be: a folder or none yet, a summary that is a file or a stream
(:func:`~harness._core.fsio.output_kind`). What the session writes into can be made and written
there (:func:`~harness._core.fsio.probe_folder`: not under a file, not in ``/proc``). A named
baseline is one plain entry of the storage, never a link out of it, and a complete one whose
verdicts are all regular files (:func:`~harness._results.baseline.baseline_verdicts`). Nothing
compared or saved is the folder the session writes its verdicts into, and the summary is never one
of the session's folders nor written among verdicts. ``--memreport-history`` is a history, or a new
or empty folder that can be written, or a store that answers in time
(:func:`~harness._history.archive.open_history`), and the reports are never written inside it.
Anything else is
:class:`~harness._core.errors.BadInput`, which the plugin turns into pytest's usage error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness._core.errors import BadInput
from harness._core.fsio import output_kind, probe_folder, same_folder
from harness._core.naming import check_file_name, check_path

if TYPE_CHECKING:
    import pytest

DEFAULT_BASELINE = "baseline"
STORAGE = ".leakgate"
"""Where named baselines are kept, in the rootdir, unless ``--memreport-storage`` says."""


def add_session_options(group: pytest.OptionGroup) -> None:
    """Declare the options that act at the session's end (the plugin's group)."""
    group.addoption(
        "--memreport-save",
        nargs="?",
        const=DEFAULT_BASELINE,
        default=None,
        metavar="NAME",
        help=f"keep this session's verdicts as the baseline NAME (default {DEFAULT_BASELINE}) "
        "in the storage folder; needs --memreport",
    )
    group.addoption(
        "--memreport-compare",
        nargs="?",
        const=DEFAULT_BASELINE,
        default=None,
        metavar="NAME|PATH",
        help="compare this session's verdicts with a saved baseline (a name in the storage "
        "folder, or a path with a slash to a folder of verdicts) by the rules of 'leakgate "
        "gate': a regression, or a baseline verdict this session did not produce, fails the "
        "session; needs --memreport",
    )
    group.addoption(
        "--memreport-storage",
        default=None,
        metavar="DIR",
        help=f"where named baselines are kept (default: {STORAGE}/ in the rootdir)",
    )
    group.addoption(
        "--memreport-history",
        default=None,
        metavar="DIR",
        help="append each traced test's summary to the history DIR (a folder or a pyarrow "
        "URI, made when new) at the session's end; see 'leakgate history'",
    )
    group.addoption(
        "--memreport-json",
        default=None,
        metavar="PATH",
        help="write one machine-readable summary of the session's verdicts (and the "
        "comparison) to PATH; schema in reports/README.md",
    )


def read_session_options(config: pytest.Config) -> SessionOptions:
    """The session's options as given to pytest, checked (:func:`session_options`)."""
    return session_options(
        config.getoption("memreport"),
        save=config.getoption("memreport_save"),
        compare=config.getoption("memreport_compare"),
        summary=config.getoption("memreport_json"),
        storage=config.getoption("memreport_storage"),
        default_storage=config.rootpath / STORAGE,
        history=config.getoption("memreport_history"),
    )


@dataclass(frozen=True)
class SessionOptions:
    """Where a pytest session writes its reports, and what it does with its verdicts at its
    end: the baseline folder it compares with, the one it saves into, the summary file."""

    directory: Path | None
    compare: Path | None = None
    save: Path | None = None
    json: Path | None = None
    history: str | None = None

    @property
    def ends(self) -> bool:
        """Whether the session's end compares, saves or summarises."""
        return (self.compare, self.save, self.json) != (None, None, None)


def session_options(
    memreport: str | None,
    *,
    save: str | None = None,
    compare: str | None = None,
    summary: str | None = None,
    storage: str | None = None,
    default_storage: Path,
    history: str | None = None,
) -> SessionOptions:
    """Every option checked; ``storage`` is ``--memreport-storage`` as given (None for
    ``default_storage``)."""
    directory = None if memreport is None else _folder(memreport, "--memreport", written=True)
    baselines = save is not None or compare is not None
    if baselines and directory is None:
        flag = "--memreport-save" if save is not None else "--memreport-compare"
        raise BadInput("needs --memreport (the verdicts it keeps or compares)", field=flag)
    kept = default_storage if storage is None else _folder(storage, "--memreport-storage")
    if baselines:
        _folder(kept, "--memreport-storage", written=save is not None)
        if directory is not None and same_folder(kept, directory):
            raise BadInput(
                "is the report folder (--memreport): keep baselines apart from the reports",
                path=kept,
                field="--memreport-storage",
            )
    saved = None if save is None else _in_storage(kept, save, "--memreport-save", written=True)
    compared = None if compare is None else find_baseline(kept, compare)
    for folder, flag in ((compared, "--memreport-compare"), (saved, "--memreport-save")):
        if folder is not None and directory is not None and same_folder(folder, directory):
            raise BadInput(
                "is the folder this session writes into (--memreport): its verdicts would be "
                "compared with or saved over themselves",
                path=folder,
                field=flag,
            )
    verdicts = {
        "--memreport": directory,
        "--memreport-compare": compared,
        "--memreport-save": saved,
    }
    written = None if summary is None else _summary(summary, verdicts, kept)
    if history is not None:
        # lazily: pyarrow, only when asked
        from harness._history.archive import history_around, open_history

        try:
            open_history(history, mode="check")
        except BadInput as exc:
            raise BadInput(exc.problem, path=exc.path, field="--memreport-history") from None
        around = None if directory is None else history_around(directory, history)
        if around is not None:
            said = f"is inside the history {around}: keep the reports apart from it"
            raise BadInput(said, path=directory, field="--memreport")
    return SessionOptions(directory, compared, saved, written, history)


def find_baseline(storage: Path, given: str) -> Path:
    """The folder ``given`` names: a path when it has a separator (``./nightly``), else a name
    under ``storage``. ``BadInput`` unless it is a folder holding at least one verdict, and a
    complete baseline (:func:`~harness._results.baseline.baseline_verdicts`)."""
    from harness._results.baseline import baseline_verdicts  # lazily: the plugin loads light

    flag = "--memreport-compare"
    named = os.sep in given or "/" in given
    folder = check_path(given, flag, folder=True) if named else _in_storage(storage, given, flag)
    if not folder.exists():
        saved = sorted(p.name for p in storage.iterdir() if p.is_dir()) if storage.is_dir() else []
        known = f"; saved: {', '.join(saved)}" if saved else f"; none saved in {storage}"
        raise BadInput(f"no such baseline{'' if named else known}", path=folder)
    if not folder.is_dir():
        raise BadInput("a baseline must be a folder of verdicts, not a file", path=folder)
    if not baseline_verdicts(folder):
        raise BadInput("no verdicts in this baseline", path=folder)
    return folder


def _folder(given: str | os.PathLike[str], flag: str, *, written: bool = False) -> Path:
    """A folder: a path that fits, and a folder or nothing yet; one the session is ``written``
    into can also be made there and take a file (:func:`~harness._core.fsio.probe_folder`)."""
    folder = check_path(given, flag, folder=True)
    if folder.exists() and not folder.is_dir():
        raise BadInput("not a folder", path=folder, field=flag)
    if written:
        _writable(folder, folder, flag)
    return folder


def _writable(path: Path, folder: Path, flag: str) -> None:
    """``BadInput`` naming ``path`` and ``flag`` when no file can be written into ``folder``
    (``path`` itself, or the folder of the file ``path``)."""
    try:
        probe_folder(folder)
    except OSError as exc:
        problem = f"cannot be written ({exc.filename}: {exc.strerror or exc})"
        raise BadInput(problem, path=path, field=flag) from None


def _in_storage(storage: Path, name: str, flag: str, *, written: bool = False) -> Path:
    """The baseline ``name`` in ``storage``: a plain name, whose entry is a folder or nothing
    yet, never a link (a baseline is kept in the storage itself, never followed out of it)."""
    folder = _folder(storage / check_file_name(name, flag), flag, written=written)
    if folder.is_symlink():
        problem = "a link: a baseline is never followed out of the storage"
        raise BadInput(problem, path=folder, field=flag)
    return folder


def _summary(given: str, verdicts: dict[str, Path | None], storage: Path) -> Path:
    """``--memreport-json``: a file or a stream, none of the session's folders (``verdicts``,
    the folders of verdicts by option, and the baselines' ``storage``), a file only where one
    can be written, and never among verdicts (where the gate and the next comparison would read
    it as one)."""
    flag = "--memreport-json"
    path = check_path(given, flag)
    if path.is_dir():
        raise BadInput("expected a file path, got a folder", path=path, field=flag)
    for option, folder in {**verdicts, "--memreport-storage": storage}.items():
        if folder is not None and same_folder(path, folder):
            problem = f"is the folder {folder} ({option}), which a file would take the place of"
            raise BadInput(problem, path=path, field=flag)
    try:
        kind = output_kind(path)
    except OSError as exc:
        raise BadInput(exc.strerror or str(exc), path=path, field=flag) from None
    if kind == "file":
        _writable(path, path.parent, flag)
    for folder in verdicts.values():
        if folder is not None and same_folder(path.parent, folder):
            raise BadInput(
                f"among the verdicts of {folder}, where it would be read as one: write it "
                "elsewhere",
                path=path,
                field=flag,
            )
    return path

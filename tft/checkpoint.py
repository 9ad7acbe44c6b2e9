"""Reading a trainer checkpoint safely: a file that cannot resume the given model is refused
with a :class:`CheckpointError` naming it, before anything of the trainer is touched."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["KEYS", "CheckpointError", "read_checkpoint"]

KEYS = ("model", "optimizer", "scheduler", "steps_per_epoch", "state", "history", "rng")
"""The entries of a checkpoint written by :meth:`tft.trainer.Trainer.save_checkpoint`."""


class CheckpointError(ValueError):
    """A file that cannot resume a trainer; the message names the file and the problem."""


def read_checkpoint(
    path: str | os.PathLike[str], model: nn.Module, device: torch.device | str = "cpu"
) -> dict[str, Any]:
    """The payload of checkpoint ``path``, loaded with ``weights_only`` onto ``device``, after
    checking that it has every entry and that its model state fits ``model`` key for key and
    shape for shape."""
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"{path}: is a folder, not a checkpoint")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            payload = torch.load(path, map_location=device, weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except EOFError:
        raise CheckpointError(f"{path}: empty or cut short, not a checkpoint") from None
    except Exception as exc:  # torch.load has no narrower error for a foreign or corrupt file
        raise CheckpointError(f"{path}: not a checkpoint ({type(exc).__name__})") from None
    if not isinstance(payload, dict):
        kind = type(payload).__name__
        raise CheckpointError(f"{path}: not a trainer checkpoint (holds a {kind})")
    missing = [key for key in KEYS if key not in payload]
    if missing:
        raise CheckpointError(f"{path}: not a trainer checkpoint (no {', '.join(missing)})")
    if problem := _state_mismatch(model.state_dict(), payload["model"]):
        raise CheckpointError(f"{path}: does not fit this model: {problem}")
    return payload


def _state_mismatch(expected: Mapping[str, torch.Tensor], found: object) -> str | None:
    """The first difference between two model states, in words; ``None`` when they fit."""
    if not isinstance(found, Mapping) or not all(torch.is_tensor(v) for v in found.values()):
        return "its model entry is not a state dict"
    missing = [k for k in expected if k not in found]
    extra = [k for k in found if k not in expected]
    if missing or extra:
        parts = [f"{len(missing)} missing"] if missing else []
        parts += [f"{len(extra)} unexpected"] if extra else []
        return f"{' and '.join(parts)} entries (first: {(missing or extra)[0]})"
    for key, value in expected.items():
        if found[key].shape != value.shape:
            return (
                f"{key} has shape {list(found[key].shape)}, this model {list(value.shape)}"
                " (another model size?)"
            )
    return None

"""Quantisation-aware training built on core torch ops, and an INT8 export.

Every ``nn.Linear`` trains against symmetric per-channel INT8 weights (a parametrisation) and
dynamically quantised INT8 inputs (a forward pre-hook), with straight-through gradients: the
arithmetic that :func:`export_int8` and dynamic INT8 inference perform. LSTM weights stay float.

``torch.ao.quantization`` is deprecated and ``torchao`` targets large-model kernels and adds a
dependency; ``torch.fake_quantize_per_*_affine`` is all this needs and is stable core API.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.nn.utils import parametrize

QMAX = 127


def _channel_scale(weight: torch.Tensor) -> torch.Tensor:
    return weight.detach().abs().amax(dim=1).clamp_min(1e-12) / QMAX


class WeightFakeQuant(nn.Module):
    """Round a Linear weight to symmetric per-output-channel INT8 in the forward pass."""

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        scale = _channel_scale(weight)
        zero = torch.zeros(weight.shape[0], dtype=torch.int32, device=weight.device)
        return torch.fake_quantize_per_channel_affine(weight, scale, zero, 0, -QMAX, QMAX)


def _quantize_input(module: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor]:
    (x,) = args
    lo = x.detach().amin().clamp(max=0.0)
    hi = x.detach().amax().clamp(min=0.0)
    scale = ((hi - lo) / 255).clamp_min(1e-12).float().reshape(1)
    zero = (-128 - torch.round(lo / scale)).clamp(-128, 127).to(torch.int32).reshape(1)
    return (torch.fake_quantize_per_tensor_affine(x, scale, zero, -128, 127),)


def prepare_qat(model: nn.Module) -> nn.Module:
    """Make every ``nn.Linear`` of ``model`` train under INT8 fake quantisation (in place)."""
    for module in model.modules():
        if isinstance(module, nn.Linear) and not parametrize.is_parametrized(module, "weight"):
            parametrize.register_parametrization(module, "weight", WeightFakeQuant())
            module.register_forward_pre_hook(_quantize_input)
    return model


def qat_schedule(total_steps: int, warmup: float, cooldown: float) -> Callable[[int], float]:
    """Learning-rate factor per optimizer step: linear warm-up, plateau, linear cool-down.

    ``warmup`` and ``cooldown`` are fractions of ``total_steps``; the factor starts and ends at
    5% of the base rate, and stays there for steps past ``total_steps`` (after OOM back-off).
    """
    floor = 0.05
    up = max(1, math.ceil(warmup * total_steps))
    down = max(1, math.ceil(cooldown * total_steps))

    def factor(step: int) -> float:
        if step < up:
            return floor + (1 - floor) * step / up
        left = total_steps - step
        if left <= 0:
            return floor
        return floor + (1 - floor) * min(1.0, left / down)

    return factor


def export_int8(model: nn.Module) -> dict[str, torch.Tensor]:
    """A weights-only state dict: INT8 weights and float scales for each quantised Linear.

    Keys of quantised weights are ``<module>.weight_int8`` and ``<module>.weight_scale``; every
    other parameter and buffer is kept in float under its plain name.
    """
    state: dict[str, torch.Tensor] = {}
    for key, tensor in model.state_dict().items():
        stem, quantised, _ = key.partition("parametrizations.weight.original")
        if not quantised:
            state[key] = tensor.detach().cpu()
            continue
        scale = _channel_scale(tensor)
        q = torch.round(tensor / scale[:, None]).clamp(-QMAX, QMAX).to(torch.int8)
        state[f"{stem}weight_int8"] = q.cpu()
        state[f"{stem}weight_scale"] = scale.cpu()
    return state


def load_int8(model: nn.Module, state: dict[str, torch.Tensor]) -> nn.Module:
    """Load an :func:`export_int8` state into a plain float ``model`` (weights dequantised)."""
    plain = {k: v for k, v in state.items() if not k.endswith(("weight_int8", "weight_scale"))}
    for key, q in state.items():
        if key.endswith("weight_int8"):
            stem = key.removesuffix("weight_int8")
            plain[f"{stem}weight"] = q.float() * state[f"{stem}weight_scale"][:, None]
    model.load_state_dict(plain)
    return model

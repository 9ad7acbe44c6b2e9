"""A compact Temporal Fusion Transformer (Lim et al., 2019) for multi-horizon quantile forecasts.

Read top-down: the config, the model's forward pass, the losses, then the building blocks from
the largest (attention, variable selection) to the smallest (embeddings, the LSTM).

Shapes: B batch, T_enc encoder (past) steps, T_dec decoder (future) steps, T = T_enc + T_dec,
d hidden size, m variables, Q quantiles.

The per-variable networks of all three variable selections (static, encoder, decoder) run
together as one batched matmul per layer (``TemporalFusionTransformer.variables``, a
``GroupedGRN``), and real inputs are embedded by one ``RealEmbedding``; every other projection
is an ``nn.Linear`` (what QAT quantises). At batch 1 the model is bound by the number of
operators and of parameter tensors (clipping and the optimizer step pay per tensor) more than by
arithmetic: layers that read the same input are computed as one layer
(``GatedResidualNetwork.fc_in``, ``InterpretableMultiHeadAttention.key_value``), and norms keep
scale and shift in one tensor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class TFTConfig:
    """Input sizes and hyper-parameters of a :class:`TemporalFusionTransformer`.

    ``static_cardinalities`` gives the number of categories of each static input; ``n_observed``
    counts past-only real inputs and ``n_known`` real inputs known for past and future steps.
    """

    static_cardinalities: tuple[int, ...] = (1,)
    n_observed: int = 4
    n_known: int = 4
    encoder_length: int = 60
    decoder_length: int = 10
    hidden_size: int = 32
    n_heads: int = 4
    dropout: float = 0.1
    quantiles: tuple[float, ...] = (0.1, 0.5, 0.9)

    def __post_init__(self) -> None:
        object.__setattr__(self, "static_cardinalities", tuple(self.static_cardinalities))
        object.__setattr__(self, "quantiles", tuple(self.quantiles))
        cards = self.static_cardinalities
        if not cards or not all(_is_int(c) and c >= 1 for c in cards):
            raise ValueError(
                f"static_cardinalities must be a non-empty sequence of ints >= 1, got {cards}"
            )
        minimums = {
            "n_observed": 0,
            "n_known": 1,
            "encoder_length": 1,
            "decoder_length": 1,
            "hidden_size": 1,
            "n_heads": 1,
        }
        for name, minimum in minimums.items():
            value = getattr(self, name)
            if not _is_int(value) or value < minimum:
                raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
        if self.hidden_size % self.n_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by n_heads ({self.n_heads})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        qs = self.quantiles
        if (
            not qs
            or not all(isinstance(q, float | int) and 0.0 < q < 1.0 for q in qs)
            or not all(a < b for a, b in pairwise(qs))
        ):
            raise ValueError(f"quantiles must be strictly increasing values in (0, 1), got {qs}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Interpretation(NamedTuple):
    """What one forward pass attended to and selected; detached, so it holds no graph.

    ``attention`` [B, T_dec, T] is averaged over heads (decoder steps attend to encoder and
    decoder steps; zero on future steps). Selection weights sum to 1 over variables:
    ``static_weights`` [B, n_static], ``encoder_weights`` [B, T_enc, n_observed + n_known]
    (observed first, then known) and ``decoder_weights`` [B, T_dec, n_known].
    """

    attention: Tensor
    static_weights: Tensor
    encoder_weights: Tensor
    decoder_weights: Tensor


class TemporalFusionTransformer(nn.Module):
    """Temporal Fusion Transformer predicting ``len(config.quantiles)`` quantiles per future step.

    ``forward(batch)`` takes a dict with ``"static"`` LongTensor [B, n_static], ``"observed"``
    [B, T_enc, n_observed] and ``"known"`` [B, T, n_known] (other keys are ignored) and returns
    predictions [B, T_dec, Q]; with ``interpret=True`` it returns ``(predictions,
    Interpretation)``. Nothing computed in a forward pass is kept on the module.
    """

    static_sizes: Tensor
    static_offsets: Tensor
    future_mask: Tensor

    def __init__(self, config: TFTConfig) -> None:
        super().__init__()
        self.config = config
        d, p = config.hidden_size, config.dropout
        cards = config.static_cardinalities
        self.static_embedding = nn.Embedding(sum(cards), d)
        self.register_buffer("static_sizes", torch.tensor(cards), persistent=False)
        self.register_buffer(
            "static_offsets", self.static_sizes.cumsum(0) - self.static_sizes, persistent=False
        )
        n_past = config.n_observed + config.n_known
        self.real_embedding = RealEmbedding(n_past, d)

        # Each variable's own GRN: static variables, then past (observed, known), then future.
        self.variables = GroupedGRN(len(cards) + n_past + config.n_known, d, p)
        self.static_selection = VariableSelection(len(cards), d, p)
        self.static_contexts = GroupedGRN(4, d, p)
        self.encoder_selection = VariableSelection(n_past, d, p, context_size=d)
        self.decoder_selection = VariableSelection(config.n_known, d, p, context_size=d)

        self.encoder_lstm = LSTM(d)
        self.decoder_lstm = LSTM(d)
        self.lstm_gate = GateAddNorm(d, d, p)
        self.enrichment = GatedResidualNetwork(d, d, d, p, context_size=d)
        self.attention = InterpretableMultiHeadAttention(d, config.n_heads, p)
        self.attention_gate = GateAddNorm(d, d, p)
        self.positionwise = GatedResidualNetwork(d, d, d, p)
        self.output_gate = GateAddNorm(d, d, 0.0)
        self.head = nn.Linear(d, len(config.quantiles))

        t_enc, t_dec = config.encoder_length, config.decoder_length
        future = torch.full((t_dec, t_enc + t_dec), -math.inf).triu(t_enc + 1)
        self.register_buffer("future_mask", future, persistent=False)

    def forward(
        self, batch: Mapping[str, Tensor], *, interpret: bool = False
    ) -> Tensor | tuple[Tensor, Interpretation]:
        """Quantile predictions [B, T_dec, Q], and the interpretation if ``interpret``."""
        static, observed, known = self._check_inputs(batch)
        b = static.shape[0]
        t_enc, t_dec = self.config.encoder_length, self.config.decoder_length
        n_enc = t_enc * b  # time steps are rows [T * B, ...], time-major: step t of b is t * B + b

        statics = self.static_embedding(static + self.static_offsets)
        # Observed inputs are padded over the future steps, where their embeddings go unread.
        reals = torch.cat((F.pad(observed, (0, 0, 0, t_dec)), known), -1)
        embedded = self.real_embedding(_time_major(reals))
        past, future = embedded[:n_enc], embedded[n_enc:, self.config.n_observed :]

        # Every variable's GRN in one call: each variable is a group of rows (statics: a row per
        # window), padded to the longest group; outputs past a group's own rows go unread.
        rows = max(t_enc, t_dec) * b
        groups = torch.cat([_padded(x.transpose(0, 1), rows) for x in (statics, past, future)])
        sizes = (statics.shape[1], past.shape[1], future.shape[1])
        of_static, of_past, of_future = self.variables(groups).split(sizes)

        static_vector, static_weights = self.static_selection(statics, _first(of_static, b))
        contexts = self.static_contexts(static_vector.expand(4, -1, -1))
        c_select, c_enrich, hidden, cell = contexts.unbind(0)
        past, encoder_weights = self.encoder_selection(past, _first(of_past, n_enc), c_select)
        future, decoder_weights = self.decoder_selection(
            future, _first(of_future, len(future)), c_select
        )

        encoded, state = self.encoder_lstm(past.view(t_enc, b, -1), (hidden[None], cell[None]))
        decoded, _ = self.decoder_lstm(future.view(t_dec, b, -1), state)
        temporal = self.lstm_gate(
            torch.cat((encoded, decoded)).flatten(0, 1), torch.cat((past, future))
        )

        enriched = self.enrichment(temporal, c_enrich)
        queries = enriched[n_enc:]
        attended, attention = self.attention(queries, enriched, self.future_mask)
        x = self.positionwise(self.attention_gate(attended, queries))
        prediction = self.head(self.output_gate(x, temporal[n_enc:]))
        prediction = prediction.view(t_dec, b, -1).transpose(0, 1)
        if not interpret:
            return prediction
        return prediction, Interpretation(
            attention.detach(),
            static_weights.detach(),
            encoder_weights.detach().view(t_enc, b, -1).transpose(0, 1),
            decoder_weights.detach().view(t_dec, b, -1).transpose(0, 1),
        )

    def _check_inputs(self, batch: Mapping[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        c = self.config
        t_enc, t = c.encoder_length, c.encoder_length + c.decoder_length
        expected = {
            "static": ((len(c.static_cardinalities),), "integer"),
            "observed": ((t_enc, c.n_observed), "float"),
            "known": ((t, c.n_known), "float"),
        }
        tensors: list[Tensor] = []
        for key, (tail, kind) in expected.items():
            want = f"a {kind} tensor of shape [B, {', '.join(map(str, tail))}]"
            if key not in batch:
                raise ValueError(f"batch has no {key!r}: expected {want}")
            value = batch[key]
            if not isinstance(value, Tensor):
                raise ValueError(f"batch[{key!r}] must be {want}, got {type(value).__name__}")
            if value.dim() != len(tail) + 1 or tuple(value.shape[1:]) != tail:
                raise ValueError(f"batch[{key!r}] must be {want}, got shape {list(value.shape)}")
            is_int = value.dtype in (torch.int32, torch.int64)
            if is_int != (kind == "integer") or not (is_int or value.is_floating_point()):
                raise ValueError(f"batch[{key!r}] must be {want}, got dtype {value.dtype}")
            if tensors and value.shape[0] != tensors[0].shape[0]:
                raise ValueError(
                    f"batch[{key!r}] has batch size {value.shape[0]} but batch['static'] has "
                    f"{tensors[0].shape[0]}"
                )
            tensors.append(value)
        static, observed, known = tensors
        outside = (static < 0) | (static >= self.static_sizes)
        if outside.any():
            row, col = outside.nonzero()[0].tolist()
            raise ValueError(
                f"batch['static'][{row}, {col}] is {static[row, col].item()}, outside "
                f"[0, {c.static_cardinalities[col]}) (static_cardinalities[{col}])"
            )
        return static, observed, known


def _padded(x: Tensor, rows: int) -> Tensor:
    """``x`` [G, N, d] with zero rows appended up to [G, rows, d] (``x`` itself at ``rows``)."""
    return x if x.shape[1] == rows else F.pad(x, (0, 0, 0, rows - x.shape[1]))


def _first(x: Tensor, rows: int) -> Tensor:
    """The first ``rows`` rows of ``x`` [G, N, d] (``x`` itself when it has no more)."""
    return x if x.shape[1] == rows else x[:, :rows]


def _time_major(x: Tensor) -> Tensor:
    """Inputs [B, T, m] as rows [T * B, m], time-major (a view when B = 1)."""
    return x.transpose(0, 1).flatten(0, 1)


def quantile_loss(prediction: Tensor, target: Tensor, quantiles: Sequence[float]) -> Tensor:
    """Mean pinball loss of ``prediction`` [..., Q] against ``target`` [...]."""
    return pinball(prediction, target, quantiles).mean()


def q_risk(prediction: Tensor, target: Tensor, quantiles: Sequence[float]) -> Tensor:
    """Normalised quantile risk per quantile [Q]: 2 * sum of pinball losses / sum |target|."""
    losses = pinball(prediction, target, quantiles)
    return 2 * losses.reshape(-1, losses.shape[-1]).sum(0) / target.abs().sum()


def _dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Dropout: ``x`` times a mask that is 0 with probability ``p`` and 1 / (1 - p) otherwise,
    as ``F.dropout``'s, drawn with ``torch.rand`` (half the time of ``F.dropout``'s
    ``bernoulli_``); ``x`` itself, without an operator call, in evaluation or when p = 0."""
    if not training or p == 0:
        return x
    return x * torch.rand_like(x).ge_(p).div_(1 - p)


def pinball(prediction: Tensor, target: Tensor, quantiles: Sequence[float]) -> Tensor:
    """Pinball loss of each element, shape of ``prediction`` [..., Q].

    max(q e, (q - 1) e) for the error e = target - prediction, computed as e (q - [e < 0]).
    """
    if prediction.shape != (*target.shape, len(quantiles)):
        raise ValueError(
            f"prediction shape {list(prediction.shape)} must be the target shape "
            f"{list(target.shape)} followed by the number of quantiles ({len(quantiles)})"
        )
    error = target.unsqueeze(-1) - prediction
    q = torch.as_tensor(quantiles, dtype=prediction.dtype, device=prediction.device)
    return error * (q - (error < 0).to(error.dtype))


class InterpretableMultiHeadAttention(nn.Module):
    """Attention with per-head queries and keys and one value projection shared by all heads.

    Heads are averaged: since the values are shared, averaging the heads' attention matrices
    before applying them equals averaging the heads' outputs, and that one matrix is what the
    model attended to.
    """

    def __init__(self, d: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.scale = (d // n_heads) ** -0.5
        self.query = nn.Linear(d, d)
        # The keys' projection (d outputs) and the shared values' (d / n_heads) read the same
        # input, so one layer computes both: ``nn.Linear`` initialises every output row from its
        # in-features alone, so this is the same model as two layers.
        self.key_value = nn.Linear(d, d + d // n_heads)
        self.out = nn.Linear(d // n_heads, d)
        self.dropout = dropout

    def forward(self, queries: Tensor, keys: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """Attend from ``queries`` [Tq * B, d] over ``keys`` [Tk * B, d] (time-major rows),
        adding ``mask`` [Tq, Tk] to the scores (0 where allowed, -inf where not); returns the
        output [Tq * B, d] and the attention [B, Tq, Tk]."""
        (tq, tk), h, d = mask.shape, self.n_heads, queries.shape[1]
        b = queries.shape[0] // tq
        # [T * B, h * d_head] -> [B * h, T, d_head]: one batched matmul per (batch, head).
        q = self.query(queries).view(tq, b * h, -1).transpose(0, 1)
        k, v = self.key_value(keys).split((d, d // h), -1)
        k = k.reshape(tk, b * h, -1).permute(1, 2, 0)  # a view when B = 1
        scores = torch.baddbmm(mask, q, k, alpha=self.scale)
        attention = scores.softmax(-1).view(b, h, tq, tk).mean(1)
        dropped = _dropout(attention, self.dropout, self.training)
        attended = torch.bmm(dropped, v.view(tk, b, -1).transpose(0, 1))
        return self.out(attended.transpose(0, 1).reshape(tq * b, -1)), attention


class VariableSelection(nn.Module):
    """Variable selection network over m embedded variables [N, m, d].

    A GRN over all variables together (conditioned on an optional static context) gives softmax
    weights [N, m]; each variable goes through its own GRN, and the output [N, d] is their
    weighted sum. The variables' own GRNs are the caller's (the model runs those of all its
    selections in one ``GroupedGRN``) and come in as ``processed``. A single variable's weight
    is 1 whatever that GRN computes (a softmax over one value), so with m = 1 there is no such
    GRN (``selector`` is ``None``), as in pytorch-forecasting.
    """

    def __init__(
        self, n_vars: int, d: int, dropout: float, context_size: int | None = None
    ) -> None:
        super().__init__()
        self.selector = (
            GatedResidualNetwork(n_vars * d, d, n_vars, dropout, context_size)
            if n_vars > 1
            else None
        )

    def forward(
        self, x: Tensor, processed: Tensor, context: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Selected features [N, d] and selection weights [N, m] from the embedded variables
        ``x`` [N, m, d] and each one's own GRN output ``processed`` [m, N, d]; the context is
        the selector GRN's."""
        if self.selector is None:
            return processed[0], x.new_ones(x.shape[:-1])
        weights = self.selector(x.flatten(1), context).softmax(-1)
        selected = torch.bmm(weights.unsqueeze(1), processed.transpose(0, 1))
        return selected.squeeze(1), weights


class GatedResidualNetwork(nn.Module):
    """GRN(a, c) = LayerNorm(skip(a) + GLU(dropout(W1 ELU(W2 a + W3 c)))).

    ``skip`` is a linear map when the input and output sizes differ, else the identity. The
    context term exists only when ``context_size`` is given: ``a`` is then time-major rows
    [T * B, d_in] and the context [B, c] one row per batch element (row t * B + b gets row b;
    at B = 1 by broadcasting alone).
    W2 and a linear ``skip`` both read ``a``, so one layer, ``fc_in``, computes both:
    its first ``d_hidden`` outputs are W2 a and the other ``d_out`` are skip(a). ``nn.Linear``
    initialises every output row from its in-features alone, so this is the same model as two
    layers.
    """

    def __init__(
        self, d_in: int, d_hidden: int, d_out: int, dropout: float, context_size: int | None = None
    ) -> None:
        super().__init__()
        self.sizes = (d_hidden, d_out) if d_in != d_out else None
        self.fc_in = nn.Linear(d_in, d_hidden + d_out if self.sizes else d_hidden)
        self.fc_context = (
            nn.Linear(context_size, d_hidden, bias=False) if context_size is not None else None
        )
        self.fc_hidden = nn.Linear(d_hidden, d_hidden)
        self.gate = GateAddNorm(d_hidden, d_out, dropout)

    def forward(self, a: Tensor, context: Tensor | None = None) -> Tensor:
        """Apply the GRN to ``a`` [..., d_in], conditioned on ``context`` if configured."""
        h, skip = self.fc_in(a), a
        if self.sizes:
            h, skip = h.split(self.sizes, -1)
        if self.fc_context is not None:
            c = self.fc_context(context)
            h = h + c if len(c) == 1 else (h.unflatten(0, (-1, len(c))) + c).flatten(0, 1)
        return self.gate(self.fc_hidden(F.elu(h)), skip)


class GateAddNorm(nn.Module):
    """LayerNorm(skip + GLU(dropout(x))): the gated skip connection used throughout the TFT.

    GLU(x) = (W4 x + b4) * sigmoid(W5 x + b5), both halves from one linear layer, ``fc``;
    ``norm`` [2, d_out] holds the layer norm's scale (ones at first) and shift (zeros).
    """

    def __init__(self, d_in: int, d_out: int, dropout: float) -> None:
        super().__init__()
        self.dropout = dropout
        self.fc = nn.Linear(d_in, 2 * d_out)
        self.norm = nn.Parameter(torch.stack((torch.ones(d_out), torch.zeros(d_out))))

    def forward(self, x: Tensor, skip: Tensor) -> Tensor:
        """Gate ``x`` [..., d_in] and add it to ``skip`` [..., d_out], then normalise."""
        scale, shift = self.norm.unbind(0)
        gated = F.glu(self.fc(_dropout(x, self.dropout, self.training)), dim=-1)
        return F.layer_norm(skip + gated, scale.shape, scale, shift)


class GroupedGRN(nn.Module):
    """G independent context-free GRNs (d -> d), evaluated together on inputs [G, N, d].

    GRN g maps x to LayerNorm_g(x + GLU(dropout(W1 ELU(W2 x + b2) + b1))), each step one batched
    matmul over the groups. Each GRN's linear maps are stored transposed, side by side:
    ``weight`` [G, d, 4d] holds W2^T, W1^T and the GLU's [W4; W5]^T, initialised as
    ``nn.Linear`` initialises its own (uniform within 1 / sqrt(d)). ``bias`` [G, 1, 6d] holds
    their biases (4d, initialised likewise), then the layer norm's scale (d, ones at first) and
    shift (d, zeros).
    """

    def __init__(self, groups: int, d: int, dropout: float) -> None:
        super().__init__()
        bound = 1 / math.sqrt(d)
        self.sizes = (d, d, 2 * d)
        self.weight = nn.Parameter(torch.empty(groups, d, 4 * d).uniform_(-bound, bound))
        biases = torch.empty(groups, 1, 4 * d).uniform_(-bound, bound)
        ones = torch.ones(groups, 1, d)
        self.bias = nn.Parameter(torch.cat((biases, ones, torch.zeros_like(ones)), -1))
        self.dropout = dropout

    def forward(self, x: Tensor) -> Tensor:
        """Apply GRN g to ``x[g]`` for every group g: [G, N, d] -> [G, N, d]."""
        w_in, w_hidden, w_gate = self.weight.split(self.sizes, -1)
        d = x.shape[-1]
        b_in, b_hidden, b_gate, scale, shift = self.bias.split((*self.sizes, d, d), -1)
        h = torch.baddbmm(b_hidden, F.elu(torch.baddbmm(b_in, x, w_in)), w_hidden)
        h = _dropout(h, self.dropout, self.training)
        gated = F.glu(torch.baddbmm(b_gate, h, w_gate), dim=-1)
        return torch.addcmul(shift, F.layer_norm(x + gated, x.shape[-1:]), scale)


class RealEmbedding(nn.Module):
    """Embeds each of m real inputs by its own linear map: [..., m] -> [..., m, d].

    ``affine`` [2, m, d] holds each variable's weight and bias, both uniform in [-1, 1].
    """

    def __init__(self, n_vars: int, d: int) -> None:
        super().__init__()
        self.affine = nn.Parameter(torch.empty(2, n_vars, d).uniform_(-1.0, 1.0))

    def forward(self, x: Tensor) -> Tensor:
        """Return ``x[..., j] * weight[j] + bias[j]`` for every variable j."""
        weight, bias = self.affine.unbind(0)
        return torch.addcmul(bias, x.unsqueeze(-1), weight)


class LSTM(nn.LSTM):
    """A one-layer, time-major ``nn.LSTM`` (d -> d) that always takes its initial state.

    Same parameters and the same kernel as ``nn.LSTM``; ``forward`` calls the kernel directly,
    without ``nn.LSTM.forward``'s argument checks and conversions (a third of a 10-step call).
    """

    weight_ih_l0: Tensor
    weight_hh_l0: Tensor
    bias_ih_l0: Tensor
    bias_hh_l0: Tensor

    def __init__(self, d: int) -> None:
        super().__init__(d, d)

    def forward(  # type: ignore[override]
        self, x: Tensor, state: tuple[Tensor, Tensor]
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Run over ``x`` [T, B, d] from ``state`` (h, c), each [1, B, d]; returns the outputs
        [T, B, d] and the final (h, c)."""
        weights = (self.weight_ih_l0, self.weight_hh_l0, self.bias_ih_l0, self.bias_hh_l0)
        output, h, c = torch.lstm(x, state, weights, True, 1, 0.0, self.training, False, False)
        return output, (h, c)

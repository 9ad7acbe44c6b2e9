"""The TFT's training step made cheaper without changing the model: every variable selection's
per-variable GRNs run as one grouped GRN over padded rows, real inputs share one embedding, and
dropout draws its mask from ``torch.rand``."""

import pytest
import torch

from tft.model import GroupedGRN, TemporalFusionTransformer, TFTConfig, _dropout

CONFIGS = [
    TFTConfig(
        n_observed=2, n_known=2, encoder_length=8, decoder_length=3, hidden_size=8, n_heads=2
    ),
    # decoder longer than encoder, two statics (so a selector over them)
    TFTConfig(
        static_cardinalities=(3, 2),
        n_observed=2,
        n_known=3,
        encoder_length=3,
        decoder_length=6,
        hidden_size=8,
        n_heads=2,
    ),
    TFTConfig(n_observed=0, n_known=3, encoder_length=4, decoder_length=1, hidden_size=8),
]


def grouped_slice(grouped: GroupedGRN, start: int, stop: int) -> GroupedGRN:
    """A grouped GRN of its own holding GRNs ``start`` to ``stop`` of ``grouped``."""
    own = GroupedGRN(stop - start, grouped.weight.shape[1], 0.0)
    own.load_state_dict({"weight": grouped.weight[start:stop], "bias": grouped.bias[start:stop]})
    return own


def batch_of(config: TFTConfig, size: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    steps = config.encoder_length + config.decoder_length
    return {
        "static": torch.stack(
            [torch.randint(c, (size,), generator=g) for c in config.static_cardinalities], 1
        ),
        "observed": torch.randn(size, config.encoder_length, config.n_observed, generator=g),
        "known": torch.randn(size, steps, config.n_known, generator=g),
    }


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("size", [1, 3])
def test_each_selection_gets_its_own_variables_embedded_and_through_their_own_grns(config, size):
    """What each selection receives is what it computed alone before its variables' GRNs were
    grouped with the other selections' (and observed and known inputs shared an embedding)."""
    torch.manual_seed(0)
    model = TemporalFusionTransformer(config).eval()
    with torch.no_grad():  # norms away from their initial ones, so that each one counts
        model.variables.bias[..., -2 * config.hidden_size :].uniform_(0.5, 1.5)
    seen = {}
    for name in ("static", "encoder", "decoder"):
        module = getattr(model, f"{name}_selection")
        module.register_forward_pre_hook(lambda m, args, name=name: seen.update({name: args}))
    batch = batch_of(config, size)
    model(batch)

    n_s, n_obs = len(config.static_cardinalities), config.n_observed
    n_past, t_enc = n_obs + config.n_known, config.encoder_length
    weight, bias = model.real_embedding.affine

    def embedded(x: torch.Tensor, variables: slice) -> torch.Tensor:
        rows = x.transpose(0, 1).flatten(0, 1)  # time-major, as the model's rows
        return rows[..., None] * weight[variables] + bias[variables]

    past = torch.cat(
        (
            embedded(batch["observed"], slice(0, n_obs)),
            embedded(batch["known"][:, :t_enc], slice(n_obs, n_past)),
        ),
        1,
    )
    future = embedded(batch["known"][:, t_enc:], slice(n_obs, n_past))
    statics = model.static_embedding(batch["static"] + model.static_offsets)
    own = {
        "static": (statics, 0, n_s),
        "encoder": (past, n_s, n_s + n_past),
        "decoder": (future, n_s + n_past, n_s + n_past + config.n_known),
    }
    for name, (x, start, stop) in own.items():
        got_x, got_processed = seen[name][:2]
        torch.testing.assert_close(got_x, x)
        processed = grouped_slice(model.variables, start, stop)(x.transpose(0, 1))
        torch.testing.assert_close(got_processed, processed)


def test_dropout_zeroes_with_probability_p_and_scales_the_rest_from_one_rand_draw():
    x = torch.randn(200, 500)
    torch.manual_seed(5)
    dropped = _dropout(x, 0.1, True)
    torch.manual_seed(5)
    kept = torch.rand_like(x) >= 0.1
    assert torch.equal(dropped != 0, kept)
    torch.testing.assert_close(dropped, torch.where(kept, x / 0.9, 0.0))
    assert abs((dropped == 0).float().mean().item() - 0.1) < 0.005
    assert _dropout(x, 0.1, False) is x and _dropout(x, 0.0, True) is x


def test_dropout_gradient_is_the_mask():
    x = torch.randn(50, 40, requires_grad=True)
    torch.manual_seed(2)
    out = _dropout(x, 0.25, True)
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.where(out != 0, 1 / 0.75, 0.0))

import gc
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tft.model import (
    LSTM,
    GateAddNorm,
    GatedResidualNetwork,
    GroupedGRN,
    InterpretableMultiHeadAttention,
    Interpretation,
    RealEmbedding,
    TemporalFusionTransformer,
    TFTConfig,
    VariableSelection,
    pinball,
    q_risk,
    quantile_loss,
)

SMALL = TFTConfig(
    static_cardinalities=(3, 2),
    n_observed=2,
    n_known=3,
    encoder_length=8,
    decoder_length=4,
    hidden_size=16,
    n_heads=4,
)


def make_batch(config: TFTConfig, batch_size: int = 2, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    steps = config.encoder_length + config.decoder_length
    static = torch.stack(
        [torch.randint(c, (batch_size,), generator=g) for c in config.static_cardinalities], 1
    )
    return {
        "static": static,
        "observed": torch.randn(batch_size, config.encoder_length, config.n_observed, generator=g),
        "known": torch.randn(batch_size, steps, config.n_known, generator=g),
        "target": torch.randn(batch_size, config.decoder_length, generator=g),
    }


def make_model(config: TFTConfig = SMALL, seed: int = 0) -> TemporalFusionTransformer:
    torch.manual_seed(seed)
    return TemporalFusionTransformer(config)


@pytest.mark.parametrize("config", [TFTConfig(), SMALL, TFTConfig(n_observed=0, decoder_length=1)])
def test_shapes_and_interpretation(config):
    model = make_model(config).eval()
    batch = make_batch(config, batch_size=3)
    t_enc, t_dec = config.encoder_length, config.decoder_length

    prediction = model(batch)
    again, interp = model(batch, interpret=True)

    assert prediction.shape == (3, t_dec, len(config.quantiles))
    assert torch.equal(prediction, again)
    assert isinstance(interp, Interpretation)
    assert interp.attention.shape == (3, t_dec, t_enc + t_dec)
    assert interp.static_weights.shape == (3, len(config.static_cardinalities))
    assert interp.encoder_weights.shape == (3, t_enc, config.n_observed + config.n_known)
    assert interp.decoder_weights.shape == (3, t_dec, config.n_known)
    for weights in interp:
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
        assert (weights >= 0).all()


def test_each_window_of_a_batch_is_predicted_as_it_would_be_alone():
    # Time steps are time-major rows inside the model: batch elements must not mix.
    model = make_model().eval()
    batch = make_batch(SMALL, batch_size=3)
    together, interp = model(batch, interpret=True)
    for i in range(3):
        alone, alone_interp = model({k: v[i : i + 1] for k, v in batch.items()}, interpret=True)
        torch.testing.assert_close(together[i : i + 1], alone)
        for joint, single in zip(interp, alone_interp, strict=True):
            torch.testing.assert_close(joint[i : i + 1], single)


def test_causal_mask_gives_future_steps_zero_attention():
    model = make_model().eval()
    _, interp = model(make_batch(SMALL), interpret=True)
    for i in range(SMALL.decoder_length):
        visible = SMALL.encoder_length + i + 1
        assert (interp.attention[:, i, visible:] == 0).all()
        assert (interp.attention[:, i, :visible] > 0).all()


@pytest.mark.parametrize("step", [0, 1, SMALL.decoder_length - 1])
def test_changing_a_later_decoder_input_leaves_earlier_outputs_alone(step):
    model = make_model().eval()
    batch = make_batch(SMALL)
    changed = {**batch, "known": batch["known"].clone()}
    changed["known"][:, SMALL.encoder_length + step] += 3.0

    before, after = model(batch), model(changed)

    torch.testing.assert_close(after[:, :step], before[:, :step], rtol=0, atol=1e-6)
    assert (after[:, step] - before[:, step]).abs().max() > 1e-3


def test_changing_a_later_encoder_step_leaves_earlier_steps_alone():
    model = make_model().eval()
    batch = make_batch(SMALL)
    step = SMALL.encoder_length - 2
    changed = {**batch, "observed": batch["observed"].clone()}
    changed["observed"][:, step] += 3.0

    before, interp = model(batch, interpret=True)
    after, changed_interp = model(changed, interpret=True)

    enc, changed_enc = interp.encoder_weights, changed_interp.encoder_weights
    torch.testing.assert_close(changed_enc[:, :step], enc[:, :step], rtol=0, atol=1e-6)
    assert (changed_enc[:, step] - enc[:, step]).abs().max() > 1e-4
    assert ((after - before).abs().amax(dim=(0, 2)) > 1e-4).all()


def test_each_decoder_output_has_no_gradient_from_later_inputs():
    model = make_model().eval()
    batch = make_batch(SMALL)
    t_enc = SMALL.encoder_length
    for i in range(SMALL.decoder_length):
        known = batch["known"].clone().requires_grad_()
        observed = batch["observed"].clone().requires_grad_()
        model({**batch, "known": known, "observed": observed})[:, i].sum().backward()
        assert (known.grad[:, t_enc + i + 1 :] == 0).all()
        assert (known.grad[:, t_enc + i].abs().sum(-1) > 0).all()
        assert (observed.grad.abs().sum(-1) > 0).all()


def test_quantile_loss_matches_hand_computation():
    target = torch.tensor([1.0, 2.0])
    prediction = torch.tensor([[0.5, 1.0, 2.0], [3.0, 2.0, 1.0]])
    # errors y - yhat: [0.5, 0, -1] and [-1, 0, 1]; pinball max(q e, (q - 1) e) per quantile:
    # q=0.1: 0.05 + 0.9, q=0.5: 0 + 0, q=0.9: 0.1 + 0.9  -> total 1.95 over 6 terms
    loss = quantile_loss(prediction, target, (0.1, 0.5, 0.9))
    torch.testing.assert_close(loss, torch.tensor(1.95 / 6))


def test_q_risk_matches_hand_computation():
    target = torch.tensor([1.0, -2.0])
    prediction = torch.tensor([[0.5, 1.0, 2.0], [-3.0, -2.0, -1.0]])
    # errors: [0.5, 0, -1] and [1, 0, -1]; sum |y| = 3
    # q=0.1: 0.05 + 0.1 = 0.15, q=0.5: 0, q=0.9: 0.1 + 0.1 = 0.2
    risk = q_risk(prediction, target, (0.1, 0.5, 0.9))
    torch.testing.assert_close(risk, torch.tensor([2 * 0.15 / 3, 0.0, 2 * 0.2 / 3]))


def test_pinball_equals_the_larger_of_its_two_lines():
    g = torch.Generator().manual_seed(0)
    prediction, target = torch.randn(4, 5, 3, generator=g), torch.randn(4, 5, generator=g)
    prediction[0, 0, 1] = target[0, 0]  # an error of exactly zero
    q = torch.tensor((0.1, 0.5, 0.9))
    error = target.unsqueeze(-1) - prediction
    expected = torch.maximum(q * error, (q - 1) * error)
    assert torch.equal(pinball(prediction, target, [0.1, 0.5, 0.9]), expected)
    assert torch.equal(quantile_loss(prediction, target, (0.1, 0.5, 0.9)), expected.mean())


def test_losses_reject_mismatched_shapes():
    with pytest.raises(ValueError, match="number of quantiles"):
        quantile_loss(torch.zeros(2, 4, 3), torch.zeros(2, 4, 1), (0.1, 0.5, 0.9))
    with pytest.raises(ValueError, match="number of quantiles"):
        q_risk(torch.zeros(2, 4, 2), torch.zeros(2, 4), (0.1, 0.5, 0.9))


def test_loss_falls_when_overfitting_a_few_windows():
    model = make_model()
    batch = make_batch(SMALL, batch_size=4, seed=1)
    future_known = batch["known"][:, SMALL.encoder_length :]
    batch["target"] = torch.sin(2 * future_known[..., 0]) + future_known[..., 1]
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(100):
        loss = quantile_loss(model(batch), batch["target"], SMALL.quantiles)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.3 * losses[0]


def test_same_seed_gives_identical_weights_outputs_and_updates():
    batch = make_batch(SMALL)
    states, outputs = [], []
    for _ in range(2):
        model = make_model(seed=7)
        optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.manual_seed(3)
        output = model(batch)
        quantile_loss(output, batch["target"], SMALL.quantiles).backward()
        optimiser.step()
        outputs.append(output)
        states.append(model.state_dict())
    assert torch.equal(outputs[0], outputs[1])
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    other = make_model(seed=8).state_dict()
    assert not all(torch.equal(states[0][k], other[k]) for k in other)


def test_every_parameter_and_every_group_receives_a_gradient():
    model = make_model()
    quantile_loss(model(make_batch(SMALL)), make_batch(SMALL)["target"], SMALL.quantiles).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()]
    for name, module in model.named_modules():
        if isinstance(module, GroupedGRN):
            for kind, p in module.named_parameters():
                missing += [
                    f"{name}.{kind}[{g}]" for g, grad in enumerate(p.grad) if not grad.any()
                ]
        if isinstance(module, RealEmbedding):
            missing += [
                f"{name}.affine[:, {j}]"
                for j, grad in enumerate(module.affine.grad.transpose(0, 1))
                if not grad.any()
            ]
    assert missing == []


def test_lstms_start_from_static_contexts_and_hand_state_over():
    model = make_model().eval()
    calls = {}

    def record(name):
        def hook(module, args, output):
            calls[name] = (args[1], output[1])

        return hook

    handles = [
        model.static_contexts.register_forward_hook(lambda m, a, out: calls.update(ctx=out)),
        model.encoder_lstm.register_forward_hook(record("encoder")),
        model.decoder_lstm.register_forward_hook(record("decoder")),
    ]
    model(make_batch(SMALL))
    for handle in handles:
        handle.remove()

    (h0, c0), final = calls["encoder"]
    torch.testing.assert_close(h0[0], calls["ctx"][2])
    torch.testing.assert_close(c0[0], calls["ctx"][3])
    decoder_start, _ = calls["decoder"]
    assert all(a is b for a, b in zip(decoder_start, final, strict=True))


def _tensors_in(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list | tuple | set):
        for item in value:
            yield from _tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors_in(item)


def test_forward_keeps_nothing_on_the_modules():
    model = make_model()
    registered = {id(t) for t in [*model.parameters(), *model.buffers()]}
    before = {name: dict(vars(m)) for name, m in model.named_modules()}

    prediction, interp = model(make_batch(SMALL), interpret=True)
    prediction.sum().backward()

    for name, module in model.named_modules():
        state = vars(module)
        assert state.keys() == before[name].keys(), name
        assert all(state[k] is before[name][k] for k in state), name
        own = {k: v for k, v in state.items() if k not in ("_parameters", "_buffers")}
        assert all(id(t) in registered for t in _tensors_in(own)), name
    assert not any(t.requires_grad for t in interp)
    attention = weakref.ref(interp.attention)
    del prediction, interp
    gc.collect()
    assert attention() is None


def test_grouped_grn_equals_separate_grns():
    torch.manual_seed(0)
    grouped = GroupedGRN(3, 8, dropout=0.0)
    with torch.no_grad():
        grouped.bias[..., 32:].uniform_(0.5, 1.5)
    x = torch.randn(3, 5, 8)
    out = grouped(x)
    for g in range(3):
        w_in, w_hidden, w_gate = grouped.weight[g].split((8, 8, 16), -1)
        b_in, b_hidden, b_gate, scale, shift = grouped.bias[g, 0].split((8, 8, 16, 8, 8), -1)
        h = F.linear(F.elu(F.linear(x[g], w_in.T, b_in)), w_hidden.T, b_hidden)
        gated = F.glu(F.linear(h, w_gate.T, b_gate), dim=-1)
        expected = F.layer_norm(x[g] + gated, (8,), scale, shift)
        torch.testing.assert_close(out[g], expected)


def test_grouped_grn_initialises_each_map_as_nn_linear_would():
    torch.manual_seed(0)
    grouped = GroupedGRN(4, 64, dropout=0.1)
    bound = 64**-0.5
    assert grouped.weight.shape == (4, 64, 256) and grouped.bias.shape == (4, 1, 384)
    for p in (grouped.weight, grouped.bias[..., :256]):
        assert p.abs().max() <= bound and p.abs().max() > 0.95 * bound
        assert abs(p.mean()) < 0.05 * bound
    assert torch.equal(grouped.bias[..., 256:320], torch.ones(4, 1, 64))  # layer norm scale
    assert torch.equal(grouped.bias[..., 320:], torch.zeros(4, 1, 64))  # and shift
    assert len(list(grouped.parameters())) == 2


@pytest.mark.parametrize("windows", [1, 2])
def test_grn_input_layer_computes_its_hidden_input_and_skip_as_two_layers_would(windows):
    torch.manual_seed(0)
    grn = GatedResidualNetwork(12, 6, 3, dropout=0.0, context_size=5)
    assert grn.fc_in.weight.shape == (6 + 3, 12)
    bound = 12**-0.5
    assert grn.fc_in.weight.abs().max() <= bound and grn.fc_in.bias.abs().max() <= bound
    with torch.no_grad():
        grn.gate.norm.uniform_(0.5, 1.5)
    # 4 steps of each window, time-major: row t * windows + b has window b's context
    a, c = torch.randn(4 * windows, 12), torch.randn(windows, 5)

    w2, skip_w = grn.fc_in.weight.split((6, 3))
    b2, skip_b = grn.fc_in.bias.split((6, 3))
    h = F.elu(F.linear(a, w2, b2) + grn.fc_context(c).repeat(4, 1))
    gated = F.glu(grn.gate.fc(grn.fc_hidden(h)), dim=-1)
    scale, shift = grn.gate.norm
    expected = F.layer_norm(F.linear(a, skip_w, skip_b) + gated, (3,), scale, shift)
    torch.testing.assert_close(grn(a, c), expected)


def test_grn_of_equal_sizes_has_an_identity_skip():
    torch.manual_seed(0)
    grn = GatedResidualNetwork(8, 8, 8, dropout=0.0)
    assert grn.fc_in.weight.shape == (8, 8)
    a = torch.randn(3, 8)
    gated = F.glu(grn.gate.fc(grn.fc_hidden(F.elu(grn.fc_in(a)))), dim=-1)
    torch.testing.assert_close(grn(a), F.layer_norm(a + gated, (8,)))


def test_gate_add_norm_is_layer_norm_of_skip_plus_glu():
    torch.manual_seed(0)
    gate = GateAddNorm(6, 4, dropout=0.0)
    with torch.no_grad():
        gate.norm.uniform_(-1.0, 1.0)
    norm = nn.LayerNorm(4)
    with torch.no_grad():
        norm.weight.copy_(gate.norm[0])
        norm.bias.copy_(gate.norm[1])
    x, skip = torch.randn(2, 3, 6), torch.randn(2, 3, 4)
    torch.testing.assert_close(gate(x, skip), norm(skip + F.glu(gate.fc(x), dim=-1)))


def test_real_embedding_maps_each_variable_by_its_own_weight_and_bias():
    torch.manual_seed(0)
    embedding = RealEmbedding(3, 4)
    x = torch.randn(2, 5, 3)
    weight, bias = embedding.affine
    expected = torch.stack([x[..., j, None] * weight[j] + bias[j] for j in range(3)], -2)
    torch.testing.assert_close(embedding(x), expected)
    assert embedding.affine.abs().max() <= 1.0


def test_single_variable_selection_has_no_selector_and_weight_one():
    torch.manual_seed(0)
    selection = VariableSelection(1, 8, dropout=0.0)
    assert selection.selector is None
    x, processed = torch.randn(10, 1, 8), torch.randn(1, 10, 8)
    out, weights = selection(x, processed)
    assert torch.equal(weights, torch.ones(10, 1))
    assert torch.equal(out, processed[0])


def test_variable_selection_is_the_weighted_sum_of_each_variables_grn():
    torch.manual_seed(0)
    selection = VariableSelection(3, 8, dropout=0.0, context_size=4)
    x, context = torch.randn(6 * 2, 3, 8), torch.randn(2, 4)
    processed = torch.randn(3, 6 * 2, 8)  # each variable's own GRN output, per row
    out, weights = selection(x, processed, context)
    torch.testing.assert_close(weights, selection.selector(x.flatten(1), context).softmax(-1))
    expected = sum(weights[:, j, None] * processed[j] for j in range(3))
    torch.testing.assert_close(out, expected)


def test_lstm_equals_nn_lstm_with_the_same_weights():
    torch.manual_seed(0)
    ours, reference = LSTM(8), nn.LSTM(8, 8)
    reference.load_state_dict(ours.state_dict())
    x = torch.randn(5, 2, 8, requires_grad=True)
    state = (torch.randn(1, 2, 8), torch.randn(1, 2, 8))
    out, (h, c) = ours(x, state)
    want, (want_h, want_c) = reference(x, state)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(h, want_h)
    torch.testing.assert_close(c, want_c)
    grad = torch.autograd.grad(out.sum(), x)[0]
    torch.testing.assert_close(grad, torch.autograd.grad(want.sum(), x)[0])


def test_incident_sized_model_has_62_parameter_tensors():
    # Clipping and the optimizer step cost about 20 us per parameter tensor at batch 1 on a CPU:
    # layers that read the same input are one layer, norms keep scale and shift together,
    # grouped GRNs keep their norms with their biases, every selection's variables share one
    # grouped GRN and real inputs one embedding.
    config = TFTConfig(static_cardinalities=(1,), n_observed=4, n_known=4)
    model = TemporalFusionTransformer(config)
    assert len(list(model.parameters())) == 62
    assert not any(isinstance(m, nn.Dropout | nn.LayerNorm | nn.Identity) for m in model.modules())


def test_attention_equals_mean_of_heads_with_shared_values():
    torch.manual_seed(0)
    heads, d = 4, 16
    attn = InterpretableMultiHeadAttention(d, heads, dropout=0.0)
    keys = torch.randn(2, 7, d)
    queries = keys[:, 4:]
    mask = torch.ones(3, 7, dtype=torch.bool).triu(5)
    additive = torch.zeros(3, 7).masked_fill(mask, -torch.inf)
    rows, weights = attn(
        queries.transpose(0, 1).flatten(0, 1), keys.transpose(0, 1).flatten(0, 1), additive
    )
    out = rows.view(3, 2, d).transpose(0, 1)  # time-major rows back to [B, Tq, d]

    key_weight, value_weight = attn.key_value.weight.split((d, d // heads))
    key_bias, value_bias = attn.key_value.bias.split((d, d // heads))
    q = attn.query(queries).chunk(heads, -1)
    k = F.linear(keys, key_weight, key_bias).chunk(heads, -1)
    values = F.linear(keys, value_weight, value_bias)
    head_weights, head_outputs = [], []
    for qh, kh in zip(q, k, strict=True):
        scores = (qh @ kh.transpose(1, 2) / (d // heads) ** 0.5).masked_fill(mask, -torch.inf)
        head_weights.append(scores.softmax(-1))
        head_outputs.append(head_weights[-1] @ values)
    torch.testing.assert_close(weights, torch.stack(head_weights).mean(0))
    torch.testing.assert_close(out, attn.out(torch.stack(head_outputs).mean(0)))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"hidden_size": 30, "n_heads": 4}, "divisible by n_heads"),
        ({"quantiles": (0.5, 0.1)}, "strictly increasing"),
        ({"quantiles": (0.1, 0.5, 1.0)}, "in \\(0, 1\\)"),
        ({"quantiles": ()}, "quantiles"),
        ({"static_cardinalities": ()}, "static_cardinalities"),
        ({"static_cardinalities": (3, 0)}, "static_cardinalities"),
        ({"encoder_length": 0}, "encoder_length"),
        ({"n_known": 0}, "n_known"),
        ({"n_observed": -1}, "n_observed"),
        ({"hidden_size": 32.0}, "hidden_size"),
        ({"dropout": 1.0}, "dropout"),
    ],
)
def test_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TFTConfig(**kwargs)


def test_config_normalises_sequences_to_tuples():
    config = TFTConfig(static_cardinalities=[2, 3], quantiles=[0.25, 0.75])
    assert config.static_cardinalities == (2, 3)
    assert config.quantiles == (0.25, 0.75)


def _without(batch, key):
    return {k: v for k, v in batch.items() if k != key}


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda b: _without(b, "known"), r"batch has no 'known'.*\[B, 12, 3\]"),
        (
            lambda b: {**b, "observed": b["observed"][:, 1:]},
            r"batch\['observed'\].*\[B, 8, 2\].*got shape \[2, 7, 2\]",
        ),
        (lambda b: {**b, "known": b["known"][..., 0]}, r"batch\['known'\].*\[B, 12, 3\]"),
        (lambda b: {**b, "static": b["static"].float()}, r"batch\['static'\].*integer.*float32"),
        (lambda b: {**b, "observed": b["observed"].long()}, r"batch\['observed'\].*float.*int64"),
        (lambda b: {**b, "known": b["known"][:1]}, r"batch\['known'\] has batch size 1.*2"),
        (lambda b: {**b, "static": [[0, 1]]}, r"batch\['static'\].*got list"),
        (
            lambda b: {**b, "static": torch.tensor([[0, 1], [1, 2]])},
            r"batch\['static'\]\[1, 1\] is 2, outside \[0, 2\)",
        ),
        (lambda b: {**b, "static": torch.tensor([[-1, 0], [0, 0]])}, r"\[0, 0\] is -1"),
    ],
)
def test_forward_rejects_bad_inputs(edit, message):
    model = make_model()
    with pytest.raises(ValueError, match=message):
        model(edit(make_batch(SMALL)))

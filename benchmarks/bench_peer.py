"""The TFT against pytorch-forecasting's ``TemporalFusionTransformer``, on the same windows.

Both models get hidden size 32, 4 attention heads, encoder 60 and decoder 10 steps, dropout 0.1,
the quantiles (0.1, 0.5, 0.9) and batch 1; pytorch-forecasting's ``hidden_continuous_size`` is
set to the hidden size too, as the TFT here embeds each real input at the hidden size. Each
model runs the same plain loop, without Lightning: forward, the model's own quantile loss,
backward, gradient clipping at 1.0 and a fused Adam step (lr 1e-3), with subnormals flushed as
``tft.Trainer`` does; validation is forward and loss under ``torch.inference_mode``. Batches are
built before timing, in each model's input format.

Each measurement is a fresh worker process, ``python benchmarks/bench_peer.py MODEL`` (``tft``
or ``pytorch-forecasting``), which prints one JSON line: training and validation samples per
second (after 16 and 8 untimed warm-up batches), the mean time of each part of a training step
(:data:`STEP_PARTS`), and memory: the peak resident memory above the
level before the model was built (``VmHWM``, reset then), and the process's peak (imports
included; ``ru_maxrss`` would not do: after ``vfork`` and ``exec`` it keeps the parent's).
Workers alternate between the models.

    pytest benchmarks/bench_peer.py
    python benchmarks/bench_peer.py [--reps N] [--write]

Run as a script, it runs the same workers and prints section 4 of ``reports/bench.md`` (with
``--write``: puts it there, with the goal rows and the missed-goal note that come from it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
from common import (
    ROOT,
    alternating,
    incident_config,
    incident_split,
    peak_rss,
    reset_peak_rss,
    rss,
    section_arguments,
    show_section,
)
from report import goals, load_range, misses, peer_comparison, peer_section, scale_cells
from torch import nn
from torch.utils.data import Dataset, default_collate

from tft.model import TemporalFusionTransformer, TFTConfig, quantile_loss

MODELS = ("tft", "pytorch-forecasting")
WARMUP_TRAIN, WARMUP_VAL = 16, 8
STEP_PARTS = ("forward", "backward", "clip", "optimizer")
"""A training step's parts, timed in every step: forward with the loss, backward, gradient
clipping, and the optimizer's step with ``zero_grad``."""
Batch = dict[str, torch.Tensor]
Step = Callable[[Batch], torch.Tensor]


@pytest.mark.parametrize(("rep", "model"), alternating(MODELS))
def test_model(benchmark, model, rep):
    if model == "pytorch-forecasting":
        pytest.importorskip("pytorch_forecasting")
    done = benchmark.pedantic(
        subprocess.run, (worker(model),), {"capture_output": True, "text": True}, rounds=1
    )
    assert done.returncode == 0, done.stderr[-3000:]
    benchmark.extra_info.update(json.loads(done.stdout.splitlines()[-1]))


def worker(model: str) -> list[str]:
    """The command of a worker measuring ``model`` (one of :data:`MODELS`)."""
    return [sys.executable, __file__, model]


def ours(config: TFTConfig) -> tuple[nn.Module, Step]:
    """The TFT here and its loss."""
    model = TemporalFusionTransformer(config)
    return model, lambda b: quantile_loss(model(b), b["target"], config.quantiles)


def theirs(config: TFTConfig) -> tuple[nn.Module, Step]:
    """pytorch-forecasting's TFT at the same sizes, and its own loss."""
    from pytorch_forecasting import TemporalFusionTransformer as Peer
    from pytorch_forecasting.data.encoders import TorchNormalizer
    from pytorch_forecasting.metrics import QuantileLoss

    reals = [*observed_names(config), *known_names(config)]
    model = Peer(
        hidden_size=config.hidden_size,
        attention_head_size=config.n_heads,
        dropout=config.dropout,
        hidden_continuous_size=config.hidden_size,
        output_size=len(config.quantiles),
        loss=QuantileLoss(list(config.quantiles)),
        max_encoder_length=config.encoder_length,
        static_categoricals=["symbol"],
        embedding_sizes={"symbol": (config.static_cardinalities[0], config.hidden_size)},
        x_categoricals=["symbol"],
        x_reals=reals,
        time_varying_reals_encoder=reals,
        time_varying_reals_decoder=known_names(config),
        output_transformer=TorchNormalizer(method="identity"),
    )
    return model, lambda b: model.loss(model(b)["prediction"], (b["target"], None))


def observed_names(config: TFTConfig) -> list[str]:
    return [f"observed_{i}" for i in range(config.n_observed)]


def known_names(config: TFTConfig) -> list[str]:
    return [f"known_{i}" for i in range(config.n_known)]


def forecasting_batch(batch: Batch, config: TFTConfig) -> Batch:
    """A window of ours in pytorch-forecasting's input format (unscaled targets)."""
    n, t_enc, t_dec = len(batch["target"]), config.encoder_length, config.decoder_length
    symbol = batch["static"][:, None, :]
    future_observed = torch.zeros(n, t_dec, config.n_observed)
    return {
        "encoder_cat": symbol.expand(n, t_enc, 1),
        "decoder_cat": symbol.expand(n, t_dec, 1),
        "encoder_cont": torch.cat([batch["observed"], batch["known"][:, :t_enc]], -1),
        "decoder_cont": torch.cat([future_observed, batch["known"][:, t_enc:]], -1),
        "encoder_lengths": torch.full((n,), t_enc),
        "decoder_lengths": torch.full((n,), t_dec),
        "target_scale": torch.tensor([[0.0, 1.0]]).expand(n, 2),
        "target": batch["target"],
    }


def measure(name: str) -> dict[str, float]:
    """One model's training epoch and validation pass, timed, with its peak memory."""
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    split = incident_split()
    config = incident_config(split)
    build = ours if name == "tft" else theirs
    if build is theirs:
        import pytorch_forecasting  # noqa: F401  (imports stay out of the peak)

    def batches(windows: Dataset) -> list[Batch]:
        rows = [default_collate([w]) for w in windows]
        return rows if build is ours else [forecasting_batch(b, config) for b in rows]

    train, val = batches(split.train), batches(split.val)
    # The first optimizer imports some 800 modules of torch (about 70 MB): an import, not the
    # model's memory, and pytorch-forecasting's own imports have done it already.
    torch.optim.Adam([torch.zeros(1, requires_grad=True)], fused=True)
    torch.manual_seed(0)
    level, so_far = rss(), peak_rss()
    reset_peak_rss()
    model, loss = build(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)

    clock = time.perf_counter
    spent = dict.fromkeys(STEP_PARTS, 0.0)

    def step(batch: Batch) -> None:
        t0 = clock()
        value = loss(batch)
        t1 = clock()
        value.backward()
        t2 = clock()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        t3 = clock()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t4 = clock()
        for part, seconds in zip(STEP_PARTS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            spent[part] += seconds

    model.train()
    for batch in train[:WARMUP_TRAIN]:
        step(batch)
    spent.update(dict.fromkeys(STEP_PARTS, 0.0))
    started = time.perf_counter()
    for batch in train:
        step(batch)
    train_s = time.perf_counter() - started
    model.eval()
    with torch.inference_mode():
        for batch in val[:WARMUP_VAL]:
            loss(batch)
        started = time.perf_counter()
        for batch in val:
            loss(batch)
        val_s = time.perf_counter() - started
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "parameter_tensors": len(list(model.parameters())),
        **{f"step_{part}_s": seconds / len(train) for part, seconds in spent.items()},
        "train_samples_per_s": len(train) / train_s,
        "val_samples_per_s": len(val) / val_s,
        "peak_rise_bytes": peak_rss() - level,
        "process_peak_bytes": max(so_far, peak_rss()),
    }


def section(reps: int) -> tuple[dict[str, Any], str]:
    """Run ``reps`` alternating repetitions of the workers, as the pytest benchmark does; their
    comparison and section 4 of the report."""
    benches = []
    for rep, model in alternating(MODELS, reps):
        done = subprocess.run(worker(model), capture_output=True, text=True, check=False)
        if done.returncode:
            sys.exit(f"{model} worker failed: {done.stderr[-3000:]}")
        measured = {**json.loads(done.stdout.splitlines()[-1]), "load_1min": os.getloadavg()[0]}
        benches.append({"params": {"rep": rep, "model": model}, "extra_info": measured})
    peer = peer_comparison(benches)
    assert peer is not None
    commit = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    written = (
        f"Measured by `python benchmarks/bench_peer.py --reps {reps}` on "
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, commit {commit or 'unknown'}."
    )
    return peer, "\n\n".join(filter(None, (peer_section(peer), load_range(benches), written)))


def write_goals(peer: dict[str, Any]) -> None:
    """Replace the §4 rows of the goals table in ``reports/bench.md`` and the TFT's missed-goal
    note (removed when both throughput goals are met); the file written whole, then renamed."""
    table = goals(scale_cells([]), None, None, None, peer, None).splitlines()
    rows = {line.split(" | ")[0]: line for line in table if "(§4)" in line}
    note_start = "- **TFT vs pytorch-forecasting**"
    notes = [
        n for n in misses(None, [], None, None, peer, None).splitlines() if n.startswith(note_start)
    ]
    bench = ROOT / "reports" / "bench.md"
    lines = []
    for line in bench.read_text().splitlines():
        if line.startswith(note_start):
            lines += notes
        else:
            lines.append(rows.get(line.split(" | ")[0], line))
    temporary = bench.with_name(f".{bench.name}.tmp")
    temporary.write_text("\n".join(lines) + "\n")
    os.replace(temporary, bench)


def main(argv: Sequence[str]) -> None:
    """A worker (``MODEL``) prints its measurement as JSON; otherwise print section 4, and with
    ``--write`` put it and the goals that come from it in ``reports/bench.md``."""
    if len(argv) == 1 and argv[0] in MODELS:
        print(json.dumps(measure(argv[0])))
        return
    parser = section_arguments((__doc__ or "").splitlines()[0])
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error(f"--reps must be at least 1, got {args.reps}")
    peer, text = section(args.reps)
    show_section(text.split("\n", 1)[0], text, args.write)
    if args.write:
        write_goals(peer)


if __name__ == "__main__":
    main(sys.argv[1:])

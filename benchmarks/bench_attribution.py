"""Cost of naming what holds memory, on a realistic heap.

The heap: torch and leakgate imported, the default TFT with an Adam optimizer that has taken a
step, 300 data tensors, and a validation loop that kept 20 batches of attention output with
their graphs (the incident's fault). Prints the median and best of a few runs of:

- ``live_tensors()``, the snapshot taken at each phase START, with the heap frozen (as under a
  Recorder) and not;
- ``attribute(before)`` (at a phase END or an OOM) and ``attribute()`` without a snapshot;
- a per-batch checkpoint of a plain ``Recorder``, of one attributing at each phase END
  (``attribute=True``) and of one attributing only once growth passes a budget
  (``PhaseAttribution(growth=..., at_end=False)``): while the budget holds, only the comparison.

    python benchmarks/bench_attribution.py
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable

import torch

from harness import Recorder
from harness._attribution.holders import attribute
from harness._attribution.phase import PhaseAttribution
from harness._attribution.snapshot import live_tensors
from tft.model import TemporalFusionTransformer, TFTConfig, quantile_loss


def batch_of(config: TFTConfig, size: int = 1) -> dict[str, torch.Tensor]:
    steps = config.encoder_length + config.decoder_length
    return {
        "static": torch.zeros(size, 1, dtype=torch.long),
        "observed": torch.randn(size, config.encoder_length, config.n_observed),
        "known": torch.randn(size, steps, config.n_known),
        "target": torch.randn(size, config.decoder_length),
    }


def show(name: str, run: Callable[[], object], repeat: int = 5) -> None:
    """Print the median and best wall time of ``repeat`` runs."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1e3)
    print(f"  {name:<19} median {statistics.median(times):7.1f} ms, best {min(times):7.1f} ms")


def leak_and_measure(model: TemporalFusionTransformer, config: TFTConfig, frozen: bool) -> None:
    """Keep 20 batches of attention with their graphs after a snapshot, then time it all."""
    if frozen:
        gc.freeze()
    before = live_tensors()
    cache: list[torch.Tensor] = []
    hook = model.attention.register_forward_hook(lambda m, i, out: cache.append(out[1]))
    for _ in range(20):
        model(batch_of(config))
    hook.remove()
    what = "frozen heap (as under a Recorder)" if frozen else "unfrozen heap"
    print(f"\n{what}: {len(before)} tensors in the snapshot")
    show("live_tensors()", live_tensors)
    show("attribute(before)", lambda: attribute(before))
    show("attribute()", attribute)
    [top] = attribute(before, limit=1)
    print(f"  top holder: {top} (graph {top.graph_bytes / 2**20:.1f}MiB)")
    if frozen:
        gc.unfreeze()


def checkpoint_cost(attribution: bool | PhaseAttribution, rounds: int = 20_000) -> float:
    """Median cost of a per-batch checkpoint, in microseconds."""
    with Recorder("cpu", attribute=attribution) as rec, rec.phase("validation"):
        times = []
        for batch in range(rounds):
            started = time.perf_counter()
            rec.checkpoint("VALIDATION_BATCH", batch=batch)
            times.append(time.perf_counter() - started)
            if len(rec.samples) > 1000:
                rec.samples.clear()
    return statistics.median(times) * 1e6


def main() -> None:
    torch.set_num_threads(1)
    config = TFTConfig()
    model = TemporalFusionTransformer(config)
    optimizer = torch.optim.Adam(model.parameters())
    quantile_loss(model(batch_of(config)), batch_of(config)["target"], config.quantiles).backward()
    optimizer.step()
    data = [torch.randn(70, 9) for _ in range(300)]
    print(f"heap: {len(gc.get_objects())} gc-tracked objects, model and 300 data tensors")

    for frozen in (True, False):
        leak_and_measure(model, config, frozen)

    plain, attributed = checkpoint_cost(False), checkpoint_cost(True)
    budget = checkpoint_cost(PhaseAttribution(growth="50MB", at_end=False))
    print(
        f"\nper-batch checkpoint: plain {plain:.1f} µs, attribute=True {attributed:.1f} µs, "
        f"growth budget only {budget:.1f} µs"
    )
    del data


if __name__ == "__main__":
    main()

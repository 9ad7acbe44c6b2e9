"""A tiny TFT workload for tests: random windows and a small model, fast on one CPU thread."""

import torch
from torch.utils.data import Dataset

from tft.model import TemporalFusionTransformer, TFTConfig

ENC, DEC = 8, 3


class Windows(Dataset):
    """Random windows with a learnable target: the next steps echo a known input."""

    def __init__(self, n: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.known = torch.randn(n, ENC + DEC, 4, generator=g)
        self.observed = torch.randn(n, ENC, 4, generator=g)
        self.target = self.known[:, ENC:, 0] + 0.1 * torch.randn(n, DEC, generator=g)

    def __len__(self) -> int:
        return len(self.target)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {
            "static": torch.zeros(1, dtype=torch.long),
            "observed": self.observed[i],
            "known": self.known[i],
            "target": self.target[i],
        }


def make_model(seed: int = 0) -> TemporalFusionTransformer:
    torch.manual_seed(seed)
    return TemporalFusionTransformer(
        TFTConfig(encoder_length=ENC, decoder_length=DEC, hidden_size=8, n_heads=2)
    )

"""A tiny TFT workload for tests: random windows and a small model, fast on one CPU thread."""

import torch
from torch.utils.data import Dataset

from tft.model import TemporalFusionTransformer, TFTConfig

ENC, DEC = 8, 3


class PythonObjects(Dataset):
    """``n`` items of 300 Python strings each: a DataLoader worker reading an item writes each
    string's reference count, copying its parent's pages (copy-on-read, pytorch/pytorch#13246)."""

    def __init__(self, n: int) -> None:
        self.items = [[str(j) for j in range(300)] for _ in range(n)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> int:
        return sum(len(text) for text in self.items[index])


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

"""A tiny TFT workload for tests: random windows and a small model, fast on one CPU thread."""

import mmap
from collections.abc import Sequence

import torch
from torch.utils.data import Dataset, get_worker_info

from tft.model import TemporalFusionTransformer, TFTConfig

ENC, DEC = 8, 3
ITEM = 64 << 10
"""What a :class:`WorkerCache` keeps per item."""


class PythonObjects(Dataset):
    """``n`` items of 300 Python strings each: a DataLoader worker reading an item writes each
    string's reference count, copying its parent's pages (copy-on-read, pytorch/pytorch#13246)."""

    def __init__(self, n: int) -> None:
        self.items = [[str(j) for j in range(300)] for _ in range(n)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> int:
        return sum(len(text) for text in self.items[index])


class WorkerCache(Dataset):
    """``data`` (default: the numbers below 240), with 64 KiB kept per item read in the
    DataLoader workers that ``leaky`` names, nothing elsewhere: a buffer from malloc, written
    through, so it grows the worker's live heap; with ``pages``, a fresh anonymous mapping
    instead, which malloc does not count and which grows the worker's resident memory even
    where malloc would reuse free heap it inherited."""

    def __init__(
        self, leaky: tuple[int, ...] = (0, 1), data: Sequence = range(240), pages: bool = False
    ) -> None:
        self.leaky, self.data, self.pages, self.kept = leaky, data, pages, []

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> object:
        if get_worker_info().id in self.leaky:
            if self.pages:
                item = mmap.mmap(-1, ITEM, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                item.write(b"\1" * ITEM)
                self.kept.append(item)
            else:
                self.kept.append(bytearray(b"\1" * ITEM))
        return self.data[index]


class Sums(Dataset):
    """``n`` items, each the sum of a fresh tensor of 16384 floats (64 KiB made and freed per
    item); with ``cache`` every tensor is also kept, in whichever process reads it."""

    def __init__(self, n: int = 4 * 176, cache: bool = False) -> None:
        self.n, self.cache, self.kept = n, cache, []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        item = torch.randn(16384)
        if self.cache:
            self.kept.append(item)
        return item.sum()


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

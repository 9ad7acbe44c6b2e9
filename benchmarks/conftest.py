"""Benchmarks run torch on one thread: batch-1 work gains nothing from intra-op threads, and a
second spinning thread would compete with the other process on a 2-core machine."""

import torch

torch.set_num_threads(1)

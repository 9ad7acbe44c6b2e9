import torch

# Batch-1 workloads gain nothing from intra-op threads, and two spinning threads per process
# oversubscribe a 2-core machine under pytest-xdist.
torch.set_num_threads(1)

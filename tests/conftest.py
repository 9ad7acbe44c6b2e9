import gc

import pytest
import torch

# Batch-1 workloads gain nothing from intra-op threads, and two spinning threads per process
# oversubscribe a 2-core machine under pytest-xdist.
torch.set_num_threads(1)


@pytest.fixture
def heap_frozen():
    """Freeze what exists, as a Recorder does when it starts: attribution's usual setting, and
    a quicker walk. Tests of the unfrozen heap call ``gc.unfreeze()`` first."""
    froze = gc.get_freeze_count() == 0
    gc.freeze()
    yield
    if froze:
        gc.unfreeze()

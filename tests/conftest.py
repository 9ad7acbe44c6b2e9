import gc

import pytest
import torch
import torch._dynamo

from harness._measure import malloc
from harness._measure.patches import PATCHES

# The line above: pytester's in-process runs drop the modules a run imported, and a torch
# optimizer's construction imports torch._dynamo, which registers an operator library that a
# second import refuses (a later test then fails on "Only a single TORCH_LIBRARY"). Imported
# here, it is in every snapshot pytester restores.

# Batch-1 workloads gain nothing from intra-op threads, and two spinning threads per process
# oversubscribe a 2-core machine under pytest-xdist.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def torch_hooks_put_back():
    """Each test leaves torch's DataLoader hooks as it found them: what a test held and never
    let go of (a bare ``ChildrenReader``, a hold of ``heap_board.WORKERS``) is let go of after
    it, the newest first."""
    held = set(PATCHES.holds())
    yield
    for hold in reversed(PATCHES.holds()):
        if hold not in held:
            hold.release()


@pytest.fixture
def heap_frozen():
    """Freeze what exists, as a Recorder does when it starts: attribution's usual setting, and
    a quicker walk. Tests of the unfrozen heap call ``gc.unfreeze()`` first."""
    froze = gc.get_freeze_count() == 0
    gc.freeze()
    yield
    if froze:
        gc.unfreeze()


@pytest.fixture
def fresh_allocator():
    """The allocator serving malloc found again in the test (after it patches the C library)
    and after it."""
    malloc.heap.cache_clear()
    yield
    malloc.heap.cache_clear()

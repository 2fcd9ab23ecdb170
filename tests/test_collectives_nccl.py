"""The collectives' checks on two GPUs with NCCL: CUDA tensors, compressed on the GPU (marker gpu)."""

import pytest
import torch
import torch.multiprocessing as mp

from .collective_checks import worker

pytestmark = pytest.mark.gpu


@pytest.mark.timeout(300)
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_collectives_over_nccl_match_the_uncompressed_result(tmp_path):
    world = 2
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = [ctx.Process(target=worker, args=(r, world, str(tmp_path / "init"), queue, "nccl")) for r in range(world)]
    for p in procs:
        p.start()
    results = [queue.get() for _ in procs]
    for p in procs:
        p.join(60)
    errors = [f"rank {r}:\n{msg}" for r, status, msg in results if status != "ok"]
    assert not errors, "\n".join(errors)
    assert all(p.exitcode == 0 for p in procs)

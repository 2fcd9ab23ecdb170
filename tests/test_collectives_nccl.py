"""The collectives' checks on two GPUs with NCCL: CUDA tensors, compressed on the GPU (marker gpu)."""

from queue import Empty

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
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, str(tmp_path / "init"), queue, "nccl")) for r in range(world)]
    for p in procs:
        p.start()
    try:  # a rank that dies or hangs must fail the test, not stall it
        results = [queue.get(timeout=240) for _ in procs]
    except Empty:
        pytest.fail(f"a rank gave no result within 240 s (exit codes {[p.exitcode for p in procs]})")
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    errors = [f"rank {r}:\n{msg}" for r, status, msg in results if status != "ok"]
    assert not errors, "\n".join(errors)
    assert all(p.exitcode == 0 for p in procs)

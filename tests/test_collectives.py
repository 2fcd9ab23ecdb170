"""Compressed collectives on Gloo with several processes (world sizes 1-4)."""

import pytest
import torch.multiprocessing as mp

from .collective_checks import worker


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_collectives_match_the_uncompressed_result(world, tmp_path):
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = [ctx.Process(target=worker, args=(r, world, str(tmp_path / "init"), queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = [queue.get() for _ in procs]
    for p in procs:
        p.join(60)
    errors = [f"rank {r}:\n{msg}" for r, status, msg in results if status != "ok"]
    assert not errors, "\n".join(errors)
    assert all(p.exitcode == 0 for p in procs)

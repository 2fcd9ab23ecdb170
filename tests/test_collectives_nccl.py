"""The collectives' checks on two GPUs with NCCL: CUDA tensors, compressed on the GPU (marker gpu).

Each rank compiles the codecs' kernels before joining the group, the group's timeout is 120 s,
and ``run_ranks`` fails the test when a rank dies or gives no result in time: never a hang."""

import pytest
import torch

from .collective_checks import run_ranks, worker
from .plan_checks import plan_worker

pytestmark = pytest.mark.gpu


@pytest.mark.timeout(300)
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
@pytest.mark.parametrize("inband_kib", ["0", "2048"])
def test_collectives_over_nccl_match_the_uncompressed_result(inband_kib, tmp_path, monkeypatch):
    """Sized steps and in-band lengths (the default: the small steps in-band)."""
    monkeypatch.setenv("VISEMZ_COLLECTIVE_INBAND_KIB", inband_kib)  # the spawned ranks read it at import
    world = 2
    results = run_ranks(worker, world, lambda r, q: (r, world, str(tmp_path / "init"), q, "nccl"), timeout=240)
    errors = [f"rank {r}:\n{msg}" for r, status, msg in results if status != "ok"]
    assert not errors, "\n".join(errors)


@pytest.mark.timeout(400)
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
@pytest.mark.parametrize("world", [2, 4])
def test_plans_over_nccl_match_the_functional_api_and_refuse_mismatches(world, tmp_path):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA GPUs")
    results = run_ranks(plan_worker, world, lambda r, q: (r, world, str(tmp_path / "init"), q, "nccl"), timeout=360)
    errors = [f"rank {r}:\n{msg}" for r, status, msg in results if status != "ok"]
    assert not errors, "\n".join(errors)

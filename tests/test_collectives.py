"""Compressed collectives on Gloo with several processes (world sizes 1-4)."""

import pytest

from .collective_checks import run_ranks, worker


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_collectives_match_the_uncompressed_result(world, tmp_path, monkeypatch):
    monkeypatch.setenv("VISEMZ_COLLECTIVE_CALIBRATION_KIB", "256,4096")  # auto calibrates at 4 and 64 KiB on CPUs
    results = run_ranks(worker, world, lambda r, q: (r, world, str(tmp_path / "init"), q), timeout=200)
    errors = [f"rank {r}:\n{msg}" for r, status, msg in results if status != "ok"]
    assert not errors, "\n".join(errors)

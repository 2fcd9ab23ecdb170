"""Persistent all_reduce plans on Gloo with several processes: results against the exact sum,
mismatches refused on every rank at plan creation, a dead or stalled rank making the others raise
PeerFailedError (and only then), the functional API's plans per default group, bad algorithms."""

import pytest
import torch

from visemz.collectives import ErrorBounded, all_reduce, plan
from visemz.errors import InvalidArgumentError

from .collective_checks import run_ranks
from .plan_checks import dead_rank_worker, plan_worker, regroup_worker


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 3])
def test_plans_meet_the_exact_sum_and_refuse_mismatches(world, tmp_path, monkeypatch):
    monkeypatch.setenv("VISEMZ_COLLECTIVE_CALIBRATION_KIB", "256,4096")
    results = run_ranks(plan_worker, world, lambda r, q: (r, world, str(tmp_path / "init"), q), timeout=240)
    errors = [f"rank {r}:\n{msg}" for r, status, msg in results if status != "ok"]
    assert not errors, "\n".join(errors)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("how", ["dies", "stalls"])
def test_a_dead_or_stalled_rank_makes_the_others_raise_peer_failed_error(how, tmp_path):
    """The survivors raise PeerFailedError caused by torch.distributed's error; a bad tensor's Gloo
    error stays a RuntimeError.  ``run_ranks``'s deadline is the hang guard: a survivor that neither
    returns nor raises fails the test there, with the ranks that gave no result."""
    world, group_timeout = 3, 15
    results = run_ranks(dead_rank_worker, world, lambda r, q: (r, world, str(tmp_path / "init"), q, group_timeout, how),
                        timeout=group_timeout + 90)
    errors = [f"rank {r}:\n{msg}" for r, status, msg in results if status != "ok"]
    assert not errors, "\n".join(errors)
    by_rank = {r: done for r, _, done in results}
    assert sorted(by_rank) == [0, 1, 2] and by_rank[world - 1] == [f"{how} on purpose"], results
    for r in range(world - 1):
        bad_tensor, raised, cause, message = by_rank[r]
        assert bad_tensor.startswith("bad tensor:"), by_rank[r]
        assert (raised, cause) == ("PeerFailedError", "RuntimeError"), by_rank[r]
        assert "another rank of the group failed" in message, message
    # the transport's own report inside: a closed connection, or the group's timeout running out (a stalled
    # rank exits 3 s after that timeout; on a loaded machine its closed connection may be seen first)
    said = [by_rank[r][3].lower() for r in range(world - 1)]
    expected = ("closed by peer",) if how == "dies" else ("timed out", "closed by peer")
    assert any(e in m for m in said for e in expected), said


@pytest.mark.parametrize("call", [plan, all_reduce], ids=["plan", "functional"])
@pytest.mark.parametrize("bad", ["bogus", None, "Ring"])
def test_an_unknown_algorithm_is_refused_naming_it_and_the_allowed_ones(call, bad):
    """Refused on the caller, before any communication: no process group exists here."""
    with pytest.raises(InvalidArgumentError,
                       match=r"algorithm=.*expected one of \['auto', 'ring', 'recursive_doubling', 'plain'\]") as e:
        call(torch.zeros(8), codec=ErrorBounded(1e-3), algorithm=bad)
    assert repr(bad) in str(e.value)


@pytest.mark.timeout(200)
def test_functional_plans_do_not_outlive_their_default_group(tmp_path):
    """destroy_process_group, then a new default group of another size: the functional all_reduce
    makes a plan for the new group, not the cached one of the old (ring chunks for the old world size)."""
    results = run_ranks(regroup_worker, 3, lambda r, q: (r, str(tmp_path), q, 30), timeout=150)
    errors = [f"rank {r}:\n{msg}" for r, status, msg in results if status != "ok"]
    assert not errors, "\n".join(errors)
    assert sorted(len(done) for _, _, done in results) == [1, 2, 3]

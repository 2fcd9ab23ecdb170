"""Lazy payloads in the transport (payloads whose byte count is still in device memory), on Gloo with
CPU tensors standing in for the device words: a maker's failure or report is raised on every rank
that meets it, never a wait for a payload that will not come."""

import pytest
import torch

from visemz.collectives import transport as T
from visemz.errors import LimitExceededError, VisemzError

from .collective_checks import run_checks, run_ranks


def _settle(room: int):
    def settle(words):  # as gpu.settle_add does for a sum
        if words[1] & 64:
            raise LimitExceededError("the sum leaves int32")
        size = words[0] & 0xFFFFFFFFFFFFFFFF
        if size > room:
            raise VisemzError(f"GPU homomorphic add failed (reported size {size:#x})")
        return size

    return settle


def _lazy(count: int, report: int = 0, room: int = 100) -> T.Lazy:
    """A lazy payload of ``room`` bytes whose words say ``count`` and ``report`` (bit 64: a sum leaving int32)."""
    return T.Lazy(torch.arange(room, dtype=torch.int64).to(torch.uint8), torch.tensor([count, report]), _settle(room))


def _raised(fn) -> str:
    try:
        fn()
    except (VisemzError, RuntimeError) as e:
        return type(e).__name__
    return "none"


def _checks(rank: int, world: int) -> list[str]:
    other = 1 - rank
    # a good lazy payload goes out exactly (its count read with the incoming size) and comes back settled
    p = _lazy(37)
    got = T.sendrecv(p, other, other, None)
    assert p.n == 37 and torch.equal(got, torch.arange(37, dtype=torch.int64).to(torch.uint8))
    out = {"sent settled": True}
    # rank 0's kernel failed (count ~0): it raises what its kernel found, rank 1 raises on the -1; nobody waits
    out["failed count"] = _raised(lambda: T.sendrecv(_lazy(-1) if rank == 0 else torch.zeros(5, dtype=torch.uint8),
                                                     other, other, None))
    # rank 0's sum left int32: every rank raises it through all_sizes (rank 1 holds a good lazy payload)
    out["report, both lazy"] = _raised(lambda: T.all_sizes(_lazy(40, 64 if rank == 0 else 0), None))
    # ... or a number, whose rank cannot read the report and says so
    out["report, one lazy"] = _raised(lambda: T.all_sizes(_lazy(40, 64) if rank == 0 else 40, None))
    out["failure word"] = _raised(lambda: T.all_sizes(_lazy(-1) if rank == 0 else _lazy(7), None))
    assert T.all_sizes(_lazy(9) if rank == 0 else 11, None) == [9, 11]  # numbers and lazy payloads mix
    # sized, a sum's reports go with its count: its rank goes on (and raises them only if it reads the sum),
    # the receiver gets them beside exact bytes, for its own sums to carry on
    p = _lazy(40, 64 if rank == 0 else 0)
    got = T.sendrecv(p, other, other, None)
    assert p.n == 40 and (isinstance(got, T.Lazy) == (rank == 1)) and torch.equal(
        T.exact(got) if rank == 0 else got.data, torch.arange(40, dtype=torch.int64).to(torch.uint8))
    out["sized report, sender reads"] = _raised(lambda: T.exact(p))
    out["sized report, receiver reads"] = _raised(lambda: T.exact(got))
    out.update(_inband_checks(rank))
    return [out]


def _inband_checks(rank: int) -> dict:
    """In-band lengths: the room and its words in one batch, the received payload lazy until read."""
    other, ib, out = 1 - rank, T.InBand(100, 100, _settle(100)), {}
    got = T.sendrecv(_lazy(37 + rank), other, other, None, inband=ib)
    assert isinstance(got, T.Lazy) and got.n is None and got.data.numel() == 100
    assert torch.equal(got.words, torch.tensor([37 + other, 0]))  # not read on arrival: the words as sent
    assert torch.equal(T.exact(got), torch.arange(37 + other, dtype=torch.int64).to(torch.uint8)) and \
        got.n == 37 + other
    # an exact payload goes out in a room of its own, its count written beside it
    got = T.sendrecv(torch.full((20 + rank,), 7, dtype=torch.uint8), other, other, None, inband=ib)
    assert torch.equal(T.exact(got), torch.full((20 + other,), 7, dtype=torch.uint8))
    # what the sender's maker reported, and a failed maker's count, are raised where the payload is read
    got = T.sendrecv(_lazy(40, 64 if rank == 0 else 0), other, other, None, inband=ib)
    out["in-band report"] = _raised(lambda: T.exact(got))
    got = T.sendrecv(_lazy(-1 if rank == 0 else 40), other, other, None, inband=ib)
    out["in-band failed count"] = _raised(lambda: T.exact(got))
    # rooms that do not agree are refused before anything is posted (so on every rank alike here)
    out["room too small"] = _raised(lambda: T.sendrecv(_lazy(5, room=64), other, other, None, inband=ib))
    out["payload over room"] = _raised(lambda: T.sendrecv(torch.zeros(101, dtype=torch.uint8), other, other, None,
                                                          inband=ib))
    # rooms that differ by direction (a ring's chunks): rank 0 sends 100 bytes and receives 64, rank 1 the reverse
    rooms = (100, 64) if rank == 0 else (64, 100)
    got = T.sendrecv(_lazy(10 + rank, room=rooms[0]), other, other, None, inband=T.InBand(*rooms, _settle(rooms[1])))
    assert got.data.numel() == rooms[1] and torch.equal(T.exact(got),
                                                        torch.arange(10 + other, dtype=torch.int64).to(torch.uint8))
    T.sendrecv(_lazy(3), other, other, None, inband=ib)  # the group still works
    return out


def _worker(rank: int, world: int, init_file: str, queue) -> None:
    run_checks(_checks, rank, world, init_file, queue, "gloo")


def test_lazy_payload_failures_are_raised_on_every_rank(tmp_path):
    results = sorted(run_ranks(_worker, 2, lambda r, q: (r, 2, str(tmp_path / "init"), q), timeout=120))
    errors = [f"rank {r}:\n{msg}" for r, status, msg in results if status != "ok"]
    assert not errors, "\n".join(errors)
    (zero,), (one,) = (msg for _, _, msg in results)
    assert zero["failed count"] == "VisemzError" and one["failed count"] == "CorruptStreamError"
    assert zero["report, both lazy"] == one["report, both lazy"] == "LimitExceededError"
    assert zero["report, one lazy"] == "LimitExceededError" and one["report, one lazy"] == "CorruptStreamError"
    assert zero["failure word"] == one["failure word"] == "VisemzError"
    assert (zero["sized report, sender reads"], one["sized report, sender reads"]) == ("LimitExceededError", "none")
    assert (zero["sized report, receiver reads"], one["sized report, receiver reads"]) == ("none", "CorruptStreamError")
    assert (zero["in-band report"], one["in-band report"]) == ("none", "LimitExceededError")
    assert (zero["in-band failed count"], one["in-band failed count"]) == ("none", "VisemzError")
    for case in ("room too small", "payload over room"):
        assert zero[case] == one[case] == "InvalidArgumentError"


def test_a_lazy_payload_carries_a_count_and_a_report():
    with pytest.raises(VisemzError, match="2 words"):
        T.Lazy(torch.zeros(4, dtype=torch.uint8), torch.zeros(3, dtype=torch.int64), lambda w: w[0])

"""Checks of persistent plans run inside each rank (Gloo: tests/test_collectives_plans.py; NCCL:
tests/test_collectives_nccl.py), the dead-rank worker and the worker that changes default groups."""

from __future__ import annotations

import os
import time
import traceback
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from visemz.collectives import ErrorBounded, Lossless, all_reduce, plan
from visemz.collectives.calls import peer_failures
from visemz.errors import InvalidArgumentError, PeerFailedError, PlanMismatchError

from . import collective_checks as C


def _meets_its_contract(got: torch.Tensor, codec, algorithm: str, exact: np.ndarray, torch_sum: torch.Tensor,
                        world: int):
    """``got`` (an all_reduce's result) against references computed without visemz: plain equals
    torch.distributed's all_reduce of the uncompressed tensors; lossless is the exact float64 sum in
    rank order, rounded once to the dtype, bit for bit; error-bounded lies within W eb of the exact sum."""
    case = (codec, algorithm, got.dtype)
    if codec is None or algorithm == "plain":
        assert torch.equal(got, torch_sum), case
    elif isinstance(codec, Lossless):
        assert torch.equal(got.cpu(), torch.from_numpy(exact).to(got.dtype)), case
    else:
        assert C.bounded(got, exact, world * codec.eb), case
    assert C.same_everywhere(got.reshape(-1)), case


def _against_the_exact_sum(rank: int, world: int) -> list[str]:
    """Plans and the functional API, each checked against the sum of every rank's known input."""
    cases = [(ErrorBounded(1e-3, p), a, dt) for p in ("none", "lorenzo") for a in ("ring", "recursive_doubling")
             for dt in (torch.float32, torch.bfloat16)]
    cases += [(ErrorBounded(1e-3, "lorenzo2d"), "ring", torch.float32), (Lossless(), "auto", torch.float32),
              (Lossless(), "auto", torch.bfloat16), (None, "auto", torch.float32),
              (ErrorBounded(2e-3), "plain", torch.float16)]
    for codec, algorithm, dtype in cases:
        shape = (53, 31) if codec is not None and getattr(codec, "predictor", "") == "lorenzo2d" else (C.N,)
        n = shape[0] * shape[1] if len(shape) == 2 else shape[0]
        x = C.data(rank, dtype, n).reshape(shape)
        exact = sum(C.f64(C.data(r, dtype, n)) for r in range(world)).reshape(shape)  # float64, in rank order
        torch_sum = x.clone()
        dist.all_reduce(torch_sum)
        p = plan(x, codec=codec, algorithm=algorithm)
        via_plan, via_call = x.clone(), x.clone()
        for _ in range(2):  # twice: nothing of a call leaks into the next
            via_plan.copy_(x)
            p(via_plan)
            _meets_its_contract(via_plan, codec, algorithm, exact, torch_sum, world)
        all_reduce(via_call, codec=codec, algorithm=algorithm)
        _meets_its_contract(via_call, codec, algorithm, exact, torch_sum, world)
        assert torch.equal(via_plan, via_call), (codec, algorithm, dtype)  # and the two APIs agree exactly
    t = C.data(rank)
    handle = plan(t, codec=ErrorBounded(1e-2), algorithm="ring")(t, async_op=True)
    assert C.bounded(handle.wait(120), C.exact_sum(world), world * 1e-2)
    return ["plans and the functional API against the exact sum: error-bounded within W eb (predictors none/1-D/2-D, "
            "ring, recursive doubling, async), lossless exact, plain equal to torch.distributed's"]


def _mismatches(rank: int, world: int) -> list[str]:
    """Each differing setting raises PlanMismatchError on every rank, naming the setting and the ranks."""
    odd = rank == world - 1
    for what, make in (
        ("eb", lambda: plan(C.data(rank), codec=ErrorBounded(1e-4 if odd else 1e-3))),
        ("predictor", lambda: plan(C.data(rank), codec=ErrorBounded(1e-3, "none" if odd else "lorenzo"))),
        ("dtype", lambda: plan(C.data(rank, torch.float16 if odd else torch.float32), codec=ErrorBounded(1e-3))),
        ("values", lambda: plan(C.data(rank, n=C.N + odd), codec=ErrorBounded(1e-3))),
        ("algorithm or root", lambda: plan(C.data(rank), codec=ErrorBounded(1e-3),
                                           algorithm="ring" if odd else "auto")),
        ("op", lambda: plan(C.data(rank), op="avg" if odd else "sum")),
        ("row length", lambda: plan(C.data(rank, n=10_010).reshape((1001, 10) if odd else (10, 1001)),
                                    codec=ErrorBounded(1e-3, "lorenzo2d"))),
    ):
        try:
            make()
            raise AssertionError(f"mismatched {what} was not refused")
        except PlanMismatchError as e:
            assert what in str(e) and f"rank {world - 1}" in str(e) and "rank 0" in str(e), (what, str(e))
    p = plan(C.data(rank), codec=ErrorBounded(1e-3))
    for bad in (C.data(rank, n=C.N - 1), C.data(rank, torch.float16)):
        try:  # a call is checked on this rank alone: no communication, nothing to hang
            p(bad)
            raise AssertionError("a tensor that does not fit the plan was accepted")
        except InvalidArgumentError as e:
            assert "does not fit this plan" in str(e)
    return ["plan mismatches (eb, predictor, dtype, size, algorithm, op, row) raise on every rank, naming them"]


def plan_checks(rank: int, world: int) -> list[str]:
    done = _against_the_exact_sum(rank, world)
    if world > 1:
        done += _mismatches(rank, world)
        # the functional API still agrees per call, cached plan or not: a differing call raises everywhere
        t = C.data(rank)
        all_reduce(t.clone(), codec=ErrorBounded(1e-3), algorithm="ring")
        try:
            all_reduce(t, codec=ErrorBounded(1e-3), algorithm="ring" if rank else "recursive_doubling")
            raise AssertionError("mismatched functional call was not refused")
        except PlanMismatchError as e:
            assert "algorithm or root" in str(e)
        done.append("functional calls with cached plans still refuse a mismatch")
    return done


def plan_worker(rank: int, world: int, init_file: str, queue, backend: str = "gloo") -> None:
    C.run_checks(plan_checks, rank, world, init_file, queue, backend)


def _bad_tensor_error_passes_through(world: int) -> str:
    """A real Gloo error about a bad tensor (its text names Gloo) stays torch's RuntimeError, unchanged:
    only the transport's reports of a dead or stalled peer become PeerFailedError."""
    try:
        with peer_failures("all_gather"):  # refused by Gloo's own argument check, alike on every rank
            dist.all_gather([torch.zeros(2) for _ in range(world)], torch.zeros(3))
    except PeerFailedError as e:
        raise AssertionError(f"a bad tensor's error became PeerFailedError: {e}") from e
    except RuntimeError as e:
        assert type(e) is RuntimeError and e.__cause__ is None and "gloo" in str(e).lower(), repr(e)
        return f"bad tensor: {str(e)[:120]}"
    raise AssertionError("Gloo accepted outputs of the wrong size")


def dead_rank_worker(rank: int, world: int, init_file: str, queue, timeout_s: float, how: str) -> None:
    """Every rank makes a plan; the last rank then dies (``how="dies"``) or stalls past the group's
    timeout (``"stalls"``).  The others call the plan and report what it raised: it must be
    PeerFailedError with torch.distributed's error as its cause.  Never a hang: the parent's
    ``run_ranks`` fails the test when a survivor gives no result in time."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    try:
        seen = [_bad_tensor_error_passes_through(world)]
        t = C.data(rank)
        p = plan(t, codec=ErrorBounded(1e-3), algorithm="ring")
        p(t.clone())  # one call that everyone makes
        dist.barrier()
        if rank == world - 1:
            queue.put((rank, "ok", [f"{how} on purpose"]))
            queue.close()
            queue.join_thread()  # the result is out before the process is
            if how == "dies":
                os._exit(3)
            time.sleep(timeout_s + 3)  # alive, connections open, silent, until the others have timed out
            os._exit(0)
        time.sleep(0.5)
        try:
            p(t.clone())
            queue.put((rank, "error", "the plan ran without the last rank"))
        except Exception as e:  # noqa: BLE001 (its type is the result)
            cause = e.__cause__
            queue.put((rank, "ok", [*seen, type(e).__name__, type(cause).__name__, str(e)[:300]]))
    except BaseException:  # noqa: BLE001
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        if rank != world - 1:
            queue.close()
            queue.join_thread()  # the result is out before the process is
            os._exit(0)  # destroying a group with a dead member may itself wait for it


def _functional_sum_on_a_new_group(rank: int, world: int, init_file: str, timeout_s: float) -> list[str]:
    """Join a new default group of ``world`` ranks, all_reduce with the functional API (ring, which a
    plan for one rank runs as plain), check against the exact sum, leave the group."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    try:
        t = C.data(rank)
        all_reduce(t, codec=ErrorBounded(1e-3), algorithm="ring")
        ran = C.last_algorithm()
        assert ran == ("plain" if world == 1 else "ring"), (world, ran)  # a plan of another world size would not say so
        assert C.bounded(t, C.exact_sum(world), world * 1e-3), world
        assert C.same_everywhere(t), world
        return [f"functional all_reduce on a new group of {world}: {ran}, within {world} eb of the exact sum"]
    finally:
        dist.destroy_process_group()


def regroup_worker(rank: int, init_dir: str, queue, timeout_s: float) -> None:
    """Three processes: ranks 0 and 1 form a default group of 2 and leave it, then all three form one
    of 3, then rank 0 alone one of 1; the functional all_reduce is called with the same settings in
    each, so a plan cached for an earlier default group would run (wrong world size) in a later one."""
    try:
        done = []
        if rank < 2:
            done += _functional_sum_on_a_new_group(rank, 2, os.path.join(init_dir, "two"), timeout_s)
        done += _functional_sum_on_a_new_group(rank, 3, os.path.join(init_dir, "three"), timeout_s)
        if rank == 0:
            done += _functional_sum_on_a_new_group(rank, 1, os.path.join(init_dir, "one"), timeout_s)
        queue.put((rank, "ok", done))
    except BaseException:  # noqa: BLE001 (any failure goes back to the parent as a result)
        queue.put((rank, "error", traceback.format_exc()))

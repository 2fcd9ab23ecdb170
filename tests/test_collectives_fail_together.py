"""Collectives fail together and fast, with a group timeout of 20 s: on Gloo with three processes and CPU
tensors, and on NCCL with two processes and CUDA tensors, each on its own GPU (``cuda:rank``; marker gpu,
skipped without two GPUs).

An argument wrong on one rank (the op, the dtype, contiguity, NaN or Inf, values beyond int32 steps, a
size, the error bound, the codec, a root, a count) raises a visemz error on every rank within 5 s: its
own error on the rank that is wrong, ``PeerFailedError`` naming that rank and its reason on the others
(``PlanMismatchError`` everywhere for settings that differ).  A root that is no rank of the group is
refused on every rank.  One table of cases runs on both backends, its sizes and texts following the
group's world size.  On Gloo only: a sum that leaves int32 in the middle of a ring or of recursive
doubling on the CPU reaches every rank (``LimitExceededError``: the host engine's sums), and a peer that
dies inside a compressed phase is ``PeerFailedError`` on the others (why not on NCCL: at
``_dies_in_the_middle``).  A call that hung would last the group's 20 s timeout and then fail: the time
each rank took is part of the result."""

from __future__ import annotations

import os
import time
import traceback
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from visemz.collectives import (
    ErrorBounded,
    Lossless,
    all_gather,
    all_reduce,
    all_to_all,
    broadcast,
    plan,
    reduce_scatter,
    scatter,
    transport,
)
from visemz.errors import InvalidArgumentError, LimitExceededError, PlanMismatchError, UnsupportedFormatError

from . import collective_checks
from .collective_checks import data, run_checks, run_ranks

WORLDS = {"gloo": 3, "nccl": 2}  # backend -> ranks: CPU processes on Gloo, one GPU each on NCCL
BAD, GROUP_TIMEOUT_S, FAST_S = 1, 20, 5.0
EB = ErrorBounded(1e-3)
TWO_GPUS = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                              reason="needs two CUDA GPUs")
BACKENDS = [pytest.param("gloo", id="gloo-cpu"),
            pytest.param("nccl", id="nccl-cuda", marks=[pytest.mark.gpu, TWO_GPUS])]


def _tampered(eb: float) -> ErrorBounded:
    """An error-bounded codec whose bound was changed after construction (the collectives check it again)."""
    codec = ErrorBounded(1e-3)
    object.__setattr__(codec, "eb", eb)
    return codec


def _empty(n: int) -> torch.Tensor:
    """An output tensor on the device the rank's tensors live on (``data``'s)."""
    return torch.empty(n, device=collective_checks.DEVICE)


def _with(value: float, n: int = 1000) -> torch.Tensor:
    t = data(BAD, n=n)
    t[n // 2] = value
    return t


def _cases(rank: int, w: int) -> dict:
    """name -> (call, what the bad rank raises, text the others' PeerFailedError carries) in a group of ``w``
    ranks; ``call`` runs on every rank, wrong on rank BAD only.  A None text: every rank raises the bad rank's
    type (all refused, or PlanMismatchError)."""
    bad = rank == BAD
    t = data(rank, n=1000)
    outs = lambda n=1000: [_empty(n) for _ in range(w)]  # noqa: E731
    return {
        "op max": (lambda: all_reduce(t, op="max" if bad else "sum", codec=EB), InvalidArgumentError, "op='max'"),
        "float64": (lambda: all_reduce(t.double() if bad else t, codec=EB), UnsupportedFormatError, "float64"),
        "non-contiguous": (lambda: all_reduce(t.reshape(40, 25).t() if bad else t, codec=EB), InvalidArgumentError,
                           "contiguous"),
        "NaN": (lambda: all_reduce(_with(float("nan")) if bad else t, codec=EB), InvalidArgumentError, "NaN or Inf"),
        "Inf": (lambda: all_reduce(_with(float("inf")) if bad else t, codec=EB), InvalidArgumentError, "NaN or Inf"),
        "beyond int32 steps": (lambda: all_reduce(_with(1e7) if bad else t, codec=EB), LimitExceededError,
                               "int32 steps"),
        # (ErrorBounded(-1e-3) itself raises where it is made, before any collective is called)
        "negative eb": (lambda: all_reduce(t, codec=_tampered(-1e-3) if bad else EB), InvalidArgumentError,
                        "eb=-0.001"),
        "not a codec": (lambda: all_reduce(t, codec=1e-3 if bad else EB), InvalidArgumentError, "codec=0.001"),
        "size": (lambda: all_reduce(data(rank, n=1001 if bad else 1000), codec=EB), PlanMismatchError, None),
        "2-D rows of a 1-D tensor": (lambda: all_reduce(t if bad else t.reshape(40, 25),
                                                        codec=ErrorBounded(1e-3, "lorenzo2d")),
                                     InvalidArgumentError, "lorenzo2d"),
        "all_gather output size": (lambda: all_gather(outs(999 if bad else 1000), t, codec=EB), InvalidArgumentError,
                                   "same number of values"),
        "all_gather NaN": (lambda: all_gather(outs(), _with(float("nan")) if bad else t, codec=EB),
                           InvalidArgumentError, "NaN or Inf"),
        "broadcast src -1 on one rank": (lambda: broadcast(t, -1 if bad else 0, codec=EB), InvalidArgumentError,
                                         "src=-1"),
        "broadcast src -1 everywhere": (lambda: broadcast(t, -1, codec=EB), InvalidArgumentError, None),
        "broadcast root's Inf": (lambda: broadcast(_with(float("-inf")) if bad else t, BAD, codec=EB),
                                 InvalidArgumentError, "NaN or Inf"),
        "scatter src world+3 everywhere": (lambda: scatter(t, [t] * w, w + 3, codec=EB), InvalidArgumentError, None),
        "scatter root's list": (lambda: scatter(t, [t] * (w - bad), BAD, codec=EB), InvalidArgumentError,
                                f"{w} tensors"),
        "scatter root's float64 part": (lambda: scatter(t, [t.double() if bad else t] * w, BAD, codec=EB),
                                        UnsupportedFormatError, "float64"),
        "all_to_all float64": (lambda: all_to_all(outs(), [t.double() if bad else t] * w, codec=EB),
                               UnsupportedFormatError, "float64"),
        "all_to_all lossless count": (lambda: all_to_all(outs(), [t] * (w + bad), codec=Lossless()),
                                      InvalidArgumentError, "inputs"),
        "reduce_scatter count": (lambda: reduce_scatter(_empty(1000), [t] * (w - bad), codec=EB),
                                 InvalidArgumentError, "inputs"),
        "reduce_scatter sizes": (lambda: reduce_scatter(_empty(999 if bad else 1000), [t] * w, codec=EB),
                                 InvalidArgumentError, "same number of values"),
        "plan op": (lambda: plan(t, op="max" if bad else "avg", codec=EB), InvalidArgumentError, "op='max'"),
        "uncompressed all_reduce dtype": (lambda: all_reduce(t.double() if bad else t, codec=None),
                                          UnsupportedFormatError, "float64"),
    }


def _outcome(call) -> tuple[str, str, float]:
    dist.barrier()  # every rank starts the case together: the time is the call's own
    t0 = time.perf_counter()
    try:
        out = call()
        if hasattr(out, "wait"):
            out.wait(60)
        raised, text = "none", ""
    except Exception as e:  # noqa: BLE001 (its type and text are the result)
        raised, text = type(e).__name__, str(e)
    return raised, text, time.perf_counter() - t0


def _async_outcome(rank: int) -> tuple[str, str, float]:
    """An asynchronous call with NaN on the bad rank (values are checked where the call runs): raised by
    ``wait`` on every rank."""
    return _outcome(lambda: all_reduce(_with(float("nan")) if rank == BAD else data(rank, n=1000), codec=EB,
                                       async_op=True))


def _overflow_cases(rank: int) -> dict:
    """name -> call: CPU tensors on the three Gloo ranks whose sums leave int32 steps in the middle of the
    reduction (the host engine's sums; the CUDA-over-Gloo test has them on the GPU); every rank must raise
    LimitExceededError."""
    codec, out, world = ErrorBounded(1e-9, "none"), {}, WORLDS["gloo"]
    # every chunk's first sum (two ranks' 1.5 * 2**30 steps) leaves int32: the report travels on to the last sums
    t = torch.full((3 * 2048,), 1.5 * 2.0**30 * 2e-9)
    for algorithm in ("ring", "recursive_doubling"):
        for c in (codec, ErrorBounded(1e-9)):
            out[f"{algorithm} {c.predictor}"] = lambda a=algorithm, c=c: all_reduce(t.clone(), codec=c, algorithm=a)
    # only chunk 0's chain leaves int32, at its last sum (1e9 + 1e9 + 0.5e9 steps in any order), on its owner
    chunk0 = torch.full((2048,), (0.5e9 if rank == 2 else 1e9) * 2e-9)
    first = torch.cat([chunk0, torch.zeros(2 * 2048)])
    out["ring, chunk 0 only"] = lambda: all_reduce(first.clone(), codec=codec, algorithm="ring")
    ins = [chunk0 if j == 0 else torch.zeros(2048) for j in range(world)]
    out["reduce_scatter, chunk 0 only"] = lambda: reduce_scatter(torch.empty(2048), ins, codec=codec)
    return out


def _fail_together(rank: int, world: int) -> dict:
    """Every case on this rank (the overflows on Gloo's CPU ranks only), then an all_reduce that shows the
    group still works: what each case raised, how fast, and the all_reduce's largest error."""
    refusals = {name: _outcome(call) for name, (call, _, _) in _cases(rank, world).items()}
    refusals["async NaN"] = _async_outcome(rank)
    on_cpu = dist.get_backend() == "gloo"
    overflows = {name: _outcome(call) for name, call in _overflow_cases(rank).items()} if on_cpu else {}
    t = data(rank)  # the group still works after every refusal and overflow
    all_reduce(t, codec=EB, algorithm="ring")
    afterwards = float((t - sum(data(r) for r in range(world))).abs().max())
    return {"refusals": refusals, "overflows": overflows, "afterwards": afterwards}


def _worker(rank: int, world: int, init: str, queue, backend: str) -> None:
    """One rank, set up as every multi-rank test sets up its ranks (NCCL: ``cuda:rank``, kernels built before
    joining), with this module's group timeout."""
    run_checks(_fail_together, rank, world, init, queue, backend, GROUP_TIMEOUT_S)


@pytest.fixture(scope="module", params=BACKENDS)
def outcomes(request, tmp_path_factory) -> dict:
    """Every case above, run once on the backend's ranks (``WORLDS``): rank -> what each raised, and how fast."""
    backend, world = request.param, WORLDS[request.param]
    init = str(tmp_path_factory.mktemp(f"fail-together-{backend}") / "init")
    results = run_ranks(_worker, world, lambda r, q: (r, world, init, q, backend), timeout=540)
    errors = [f"rank {r}:\n{msg}" for r, status, msg in results if status != "ok"]
    assert not errors, "\n".join(errors)
    return {r: msg for r, _, msg in results}


@pytest.mark.timeout(600)
def test_an_argument_wrong_on_one_rank_raises_on_every_rank_within_seconds(outcomes):
    world = len(outcomes)  # every rank of the group reported (run_ranks)
    expected = {name: (kind, text) for name, (_, kind, text) in _cases(0, world).items()}
    expected["async NaN"] = (InvalidArgumentError, "NaN or Inf")
    for name, (kind, text) in expected.items():
        for r in range(world):
            raised, said, seconds = outcomes[r]["refusals"][name]
            assert seconds < FAST_S, f"{name}: rank {r} took {seconds:.1f} s ({raised}: {said})"
            if r == BAD or text is None:
                assert raised == kind.__name__, f"{name}: rank {r} raised {raised}: {said}"
            else:  # a fine rank: the bad one named, with its reason
                assert raised == "PeerFailedError", f"{name}: rank {r} raised {raised}: {said}"
                assert f"rank {BAD}: {kind.__name__}" in said and text in said, f"{name}: rank {r}: {said}"
    for r in range(world):  # and the group still works
        assert outcomes[r]["afterwards"] <= world * 1e-3 * 1.01, outcomes[r]["afterwards"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("outcomes", ["gloo"], indirect=True)  # the Gloo group's run above, not another
def test_a_sum_leaving_int32_on_the_cpu_is_raised_on_every_rank(outcomes):
    for r in range(WORLDS["gloo"]):
        assert sorted(outcomes[r]["overflows"]) == sorted(_overflow_cases(0)), outcomes[r]["overflows"]
        for name, (raised, said, seconds) in outcomes[r]["overflows"].items():
            assert raised == "LimitExceededError" and "int32" in said, f"{name}: rank {r} raised {raised}: {said}"
            assert seconds < FAST_S, f"{name}: rank {r} took {seconds:.1f} s"


# ---------------------------------------------------------------- a peer that dies in the compressed phase
# Gloo only.  On NCCL the survivors would not raise in time: the kernels of a collective whose peer has exited
# keep waiting on the GPU (a link between GPUs of one host does not notice that a process is gone), this
# rank's host blocks reading their result, and only NCCL's watchdog acts, at the group's timeout, by ending
# the process (torch's default TORCH_NCCL_ASYNC_ERROR_HANDLING) instead of raising: no PeerFailedError, and
# not within FAST_S.  A group timeout short enough to be fast would have the other NCCL cases race the watchdog.
def _dies_in_the_middle(rank: int, world: int, init: str, queue) -> None:
    """The last rank passes all_gather's agreement, then exits inside its compressed phase (its transport's
    all_gather replaced by an exit); the others report what their call raised.  One data-movement
    collective stands for all: ``calls.collective`` runs every collective's compressed phase alike."""
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    try:
        if rank == world - 1:
            queue.put((rank, "ok", "dies on purpose"))
            queue.close()
            queue.join_thread()  # the result is out before the process is
            transport.all_gather = lambda *args, **kwargs: os._exit(3)
        t0 = time.perf_counter()
        try:
            all_gather([torch.empty(1000) for _ in range(world)], data(rank, n=1000), codec=EB)
            queue.put((rank, "error", f"all_gather finished without rank {world - 1}"))
        except Exception as e:  # noqa: BLE001 (its type is the result)
            queue.put((rank, "ok", (type(e).__name__, type(e.__cause__).__name__, str(e)[:300],
                                    time.perf_counter() - t0)))
    except BaseException:  # noqa: BLE001
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        queue.close()
        queue.join_thread()
        os._exit(0)  # destroying a group with a dead member may itself wait for it


@pytest.mark.timeout(200)
def test_a_peer_dying_in_the_compressed_phase_is_peer_failed_error(tmp_path):
    world = WORLDS["gloo"]
    results = run_ranks(_dies_in_the_middle, world, lambda r, q: (r, world, str(tmp_path / "init"), q), timeout=120)
    errors = [f"rank {r}:\n{msg}" for r, status, msg in results if status != "ok"]
    assert not errors, "\n".join(errors)
    assert len(results) == world
    for r, _, got in results:
        if r != world - 1:
            raised, cause, said, seconds = got
            assert (raised, cause) == ("PeerFailedError", "RuntimeError"), f"rank {r}: {got}"
            assert "all_gather" in said and seconds < FAST_S, f"rank {r}: {got}"

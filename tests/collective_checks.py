"""Checks run inside each rank of a process group: Gloo with CPU tensors (tests/test_collectives.py)
or NCCL with CUDA tensors (tests/test_collectives_nccl.py), and ``run_ranks``, which starts the
ranks and collects their results without ever hanging."""

from __future__ import annotations

import contextlib
import time
import traceback
from datetime import timedelta
from queue import Empty

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from visemz.collectives import (
    ErrorBounded,
    Lossless,
    all_gather,
    all_reduce,
    all_to_all,
    autotune,
    broadcast,
    last_algorithm,
    reduce_scatter,
    scatter,
    transport,
)
from visemz.collectives.cost import ALGORITHMS, AlgorithmCost, CostModel
from visemz.errors import InvalidArgumentError, PlanMismatchError
from visemz.floats.error_bounded import EB_HEAD2
from visemz.floats.prediction import PREDICTORS

N = 10_007
DEVICE = torch.device("cpu")  # where the tensors under test live; the worker sets it


def data(rank: int, dtype=torch.float32, n: int = N) -> torch.Tensor:
    """Rank r's tensor: a smooth field plus noise (every rank can rebuild every other's)."""
    g = torch.Generator().manual_seed(1000 + rank)
    t = torch.linspace(0, 12, n, dtype=torch.float64)
    noise = 0.01 * torch.randn(n, generator=g, dtype=torch.float64)
    return (torch.sin(t + rank) * (rank + 1) + noise).to(dtype).to(DEVICE)


def f64(t: torch.Tensor) -> np.ndarray:
    return t.to(torch.float64).cpu().numpy()


def exact_sum(world: int, dtype=torch.float32) -> np.ndarray:
    return sum(f64(data(r, dtype)) for r in range(world))


def same_everywhere(t: torch.Tensor) -> bool:
    everyone = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, t)
    return all(torch.equal(e, everyone[0]) for e in everyone)


def bounded(got: torch.Tensor, want: np.ndarray, bound: float) -> bool:
    half_ulp = torch.finfo(got.dtype).eps * (np.abs(want) + bound) / 2
    return bool((np.abs(f64(got) - want) <= bound + half_ulp + 1e-12).all())


def checks(rank: int, world: int) -> list[str]:
    done = []
    for algorithm in ("ring", "recursive_doubling", "auto"):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            t, plain = data(rank, dtype), data(rank, dtype)
            all_reduce(t, codec=ErrorBounded(1e-3), algorithm=algorithm)
            dist.all_reduce(plain)
            # "auto" may pick plain torch.distributed, whose own rounding is the reference then
            assert bounded(t, exact_sum(world, dtype), world * 1e-3) or \
                (algorithm == "auto" and torch.equal(t, plain)), (
                algorithm, dtype)
            assert same_everywhere(t), (algorithm, dtype)
    done.append("all_reduce error-bounded ring/recursive doubling/auto, fp32/bf16/fp16")

    t = data(rank)
    all_reduce(t, op="avg", codec=ErrorBounded(1e-3), algorithm="ring")
    assert bounded(t, exact_sum(world) / world, 1e-3)
    t, plain = data(rank), data(rank)
    all_reduce(t, codec=Lossless())
    dist.all_reduce(plain)
    assert torch.equal(t.cpu(), torch.from_numpy(exact_sum(world)).float()) and same_everywhere(t)
    assert torch.allclose(t, plain, rtol=0, atol=1e-5)
    done.append("all_reduce avg and lossless")

    handle = all_reduce(data(rank), codec=ErrorBounded(1e-2), algorithm="ring", async_op=True)
    doubled = handle.get_future().then(lambda fut: fut.value() * 2)  # chained as torch's DDP hooks chain theirs
    assert isinstance(handle, torch.futures.Future)
    assert bounded(handle.wait(120), exact_sum(world), world * 1e-2) and handle.is_completed()
    assert torch.equal(doubled.wait(), handle.value() * 2)
    done.append("async all_reduce: a torch.futures.Future")

    for codec in (ErrorBounded(1e-3), Lossless()):
        inputs = [data(rank, n=997) * (j + 1) for j in range(world)]
        out = torch.empty(997, device=DEVICE)
        reduce_scatter(out, inputs, codec=codec)
        want = sum((data(r, n=997) * (rank + 1)).cpu().to(torch.float64).numpy()
                   for r in range(world))  # the float32 inputs
        assert bounded(out, want, world * 1e-3 if isinstance(codec, ErrorBounded) else 0.0), codec

        gathered = [torch.empty(N, device=DEVICE) for _ in range(world)]
        all_gather(gathered, data(rank), codec=codec)
        tol = 1e-3 if isinstance(codec, ErrorBounded) else 0.0
        assert all(bounded(g, data(r).cpu().to(torch.float64).numpy(), tol) for r, g in enumerate(gathered))

        t = data(rank) if rank == 0 else torch.zeros(N, device=DEVICE)
        broadcast(t, 0, codec=codec)
        assert bounded(t, data(0).cpu().to(torch.float64).numpy(), tol) and same_everywhere(t)

        root = world - 1
        parts = [data(j, n=501) for j in range(world)] if rank == root else None
        out = torch.empty(501, device=DEVICE)
        scatter(out, parts, root, codec=codec)
        assert bounded(out, data(rank, n=501).cpu().to(torch.float64).numpy(), tol)

        outs = [torch.empty(300, device=DEVICE) for _ in range(world)]
        all_to_all(outs, [data(rank * world + j, n=300) for j in range(world)], codec=codec)
        assert all(bounded(o, data(r * world + rank, n=300).cpu().to(torch.float64).numpy(), tol)
                   for r, o in enumerate(outs))
    done.append("reduce_scatter, all_gather, broadcast, scatter, all_to_all (error-bounded and lossless)")

    done += lorenzo2d_checks(rank, world)
    done += auto_checks(rank, world)
    done += ordering_checks(rank, world)
    if world == 1:  # nobody to disagree with
        return done
    for kwargs, what in (
        ({"codec": ErrorBounded(1e-3 if rank == 0 else 1e-4)}, "eb"),
        ({"codec": ErrorBounded(1e-3)}, "dtype"),
        ({"codec": ErrorBounded(1e-3)}, "size"),
        ({"codec": ErrorBounded(1e-3), "algorithm": "auto" if rank == 0 else "ring"}, "algorithm"),
        ({"codec": ErrorBounded(1e-3), "async_op": True}, "async size"),
    ):
        t = data(rank, torch.float16 if (what == "dtype" and rank == 0) else torch.float32,
                 N + (rank if "size" in what else 0))
        try:
            handle = all_reduce(t, **kwargs)
            if kwargs.get("async_op"):
                handle.wait(120)  # an asynchronous call's mismatch is raised by wait()
            raise AssertionError(f"mismatched {what} was not refused")
        except InvalidArgumentError as e:
            assert "ranks disagree" in str(e)
    done.append("mismatched eb, dtype, size, algorithm (also asynchronous) refused on every rank")

    t = data(rank)
    try:  # different collectives with settings of different lengths still meet in one agreement
        if rank == 0:
            broadcast(t, 0, codec=ErrorBounded(1e-3))
        else:
            all_to_all([torch.empty(3, device=DEVICE) for _ in range(world)], [t[:3]] * world)
        raise AssertionError("mismatched collectives were not refused")
    except InvalidArgumentError as e:
        assert "ranks disagree on" in str(e)
    done.append("different collectives refused on every rank")
    return done


@contextlib.contextmanager
def sent_payloads():
    """The payloads this rank hands to the transport inside the block (the real transport still moves them)."""
    sent, real = [], {name: getattr(transport, name) for name in ("exchange", "all_gather", "broadcast")}

    def exchange(sends, frm, group, *args, **kwargs):
        sent.extend(sends.values())
        return real["exchange"](sends, frm, group, *args, **kwargs)

    def all_gather(payload, group):
        sent.append(payload)
        return real["all_gather"](payload, group)

    def broadcast(payload, src, group):
        sent.extend([payload] if payload is not None else [])
        return real["broadcast"](payload, src, group)

    transport.exchange, transport.all_gather, transport.broadcast = exchange, all_gather, broadcast
    try:
        yield sent
    finally:
        for name, fn in real.items():
            setattr(transport, name, fn)


def grid(seed: int, rows: int, row: int = 37) -> torch.Tensor:
    """``data(seed)`` as a (rows, row) field."""
    return data(seed, n=rows * row).reshape(rows, row)


def lorenzo2d_checks(rank: int, world: int) -> list[str]:
    """2-D Lorenzo in the collectives other than all_reduce: rows of the tensors' last dimension on the
    wire and within eb; a 1-D tensor or differing last dimensions refused naming the codec and the
    collective; ranks that disagree on the row length refused on every rank."""
    codec, eb = ErrorBounded(1e-3, "lorenzo2d"), 1e-3
    want = lambda t: t.cpu().to(torch.float64).numpy()  # noqa: E731
    with sent_payloads() as sent:
        out = torch.empty(11, 37, device=DEVICE)
        reduce_scatter(out, [grid(rank, 11) * (j + 1) for j in range(world)], codec=codec)
        assert bounded(out, sum(want(grid(r, 11) * (rank + 1)) for r in range(world)), world * eb)

        outs = [torch.empty(13, 37, device=DEVICE) for _ in range(world)]
        all_gather(outs, grid(rank, 13), codec=codec)
        assert all(bounded(o, want(grid(r, 13)), eb) for r, o in enumerate(outs))

        t = grid(0, 9) if rank == 0 else torch.zeros(9, 37, device=DEVICE)
        broadcast(t, 0, codec=codec)
        assert bounded(t, want(grid(0, 9)), eb) and same_everywhere(t)

        root = world - 1
        t = torch.empty(5, 37, device=DEVICE)
        scatter(t, [grid(j, 5) for j in range(world)] if rank == root else None, root, codec=codec)
        assert bounded(t, want(grid(rank, 5)), eb)

        outs = [torch.empty(3, 37, device=DEVICE) for _ in range(world)]
        all_to_all(outs, [grid(rank * world + j, 3) for j in range(world)], codec=codec)
        assert all(bounded(o, want(grid(r * world + rank, 3)), eb) for r, o in enumerate(outs))
    if DEVICE.type == "cpu":  # host payloads carry the stream header (device payloads are headerless block streams)
        heads = [EB_HEAD2.unpack(bytes(transport.exact(p)[: EB_HEAD2.size].cpu().numpy())) for p in sent]
        assert sent and all(h[3] == PREDICTORS.index("lorenzo2d") and h[5] == 37 for h in heads), heads
    done = ["2-D Lorenzo in reduce_scatter, all_gather, broadcast, scatter, all_to_all: rows of the last dimension"]

    flat_t = data(rank, n=74)  # 1-D: no rows
    calls = {
        "reduce_scatter": lambda: reduce_scatter(torch.empty(74, device=DEVICE), [flat_t] * world, codec=codec),
        "all_gather": lambda: all_gather([torch.empty(74, device=DEVICE) for _ in range(world)], flat_t, codec=codec),
        "broadcast": lambda: broadcast(flat_t, 0, codec=codec),
        "scatter": lambda: scatter(flat_t, [flat_t] * world if rank == 0 else None, 0, codec=codec),
        "all_to_all": lambda: all_to_all([torch.empty(74, device=DEVICE) for _ in range(world)], [flat_t] * world,
                                         codec=codec),
        "all_gather ": lambda: all_gather([torch.empty(37, 2, device=DEVICE) for _ in range(world)], grid(rank, 2),
                                          codec=codec),  # the last dimensions differ
    }
    for what, call in calls.items():
        try:  # refused by each rank's own checks, alike on every rank, before any compressed step
            call()
            raise AssertionError(f"lorenzo2d in {what} without whole rows was accepted")
        except InvalidArgumentError as e:
            assert what.strip() in str(e) and "lorenzo2d" in str(e) and "last dimension" in str(e), (what, str(e))
    done.append("2-D Lorenzo with a 1-D tensor or differing last dimensions refused, naming codec and collective")
    if world > 1:
        t = grid(rank, 10).reshape((37, 10) if rank == world - 1 else (10, 37))  # same count, other rows
        try:
            broadcast(t, 0, codec=codec)
            raise AssertionError("ranks with different row lengths were not refused")
        except PlanMismatchError as e:
            assert "row length" in str(e), str(e)
        done.append("ranks disagreeing on the row length refused on every rank")
    return done


def gathered(values: list[float]) -> torch.Tensor:
    """Every rank's ``values`` (float64), one row per rank."""
    mine = torch.tensor(values, dtype=torch.float64, device=DEVICE)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    return torch.stack(everyone).cpu()


def identical_on_all_ranks(values: list[float]) -> bool:
    table = gathered(values)
    return bool((table == table[0]).all())


def _model_numbers(m: CostModel) -> list[float]:
    return [m.link, m.ratio, *(x for a in ALGORITHMS for x in (m.costs[a].latency, m.costs[a].codec, m.costs[a].wire))]


def _synthetic(world: int, link: float, codec: float) -> CostModel:
    """A model whose compressed algorithms cost ``codec`` s/byte of codec work on a ``link`` s/byte link."""
    costs = {"plain": AlgorithmCost(1e-4, 0.0, 1.0), "ring": AlgorithmCost(2e-4, codec, 1.0),
             "recursive_doubling": AlgorithmCost(3e-4, codec, 1.0)}
    return CostModel(world, link, costs, 4.0)


def auto_checks(rank: int, world: int) -> list[str]:
    """auto: the same valid choice on every rank, a max-reduced calibration table, the observed ratio."""
    done = []
    eb = ErrorBounded(2e-3)  # a setting no other check uses: it is calibrated here
    t = data(rank)
    all_reduce(t, codec=eb, algorithm="auto")
    chosen = last_algorithm()
    if world == 1:
        assert chosen == "plain" and autotune.model(None, eb, "float32") is None
        return ["auto on one rank is plain"]
    assert chosen in ALGORITHMS, chosen
    assert identical_on_all_ranks([ALGORITHMS.index(chosen)]), chosen
    assert bounded(t, exact_sum(world), world * 2e-3) or chosen == "plain"
    m, _ = autotune.model(None, eb, "float32")
    assert m.world == world and set(m.costs) == set(ALGORITHMS) and m.ratio > 1
    # each rank timed its own runs: only the max-reduced table makes the models equal
    assert identical_on_all_ranks(_model_numbers(m)), m

    all_reduce(data(rank), codec=eb, algorithm="ring")  # every compressed run records its final payloads' ratio
    _, noisy = autotune.model(None, eb, "float32")
    all_reduce(torch.zeros(N, device=DEVICE), codec=eb, algorithm="recursive_doubling")
    _, zeros = autotune.model(None, eb, "float32")
    assert noisy > 1 and zeros > 10 * noisy, (noisy, zeros)
    assert identical_on_all_ranks([noisy, zeros])
    done.append("auto: same valid choice on every rank, max-reduced calibration, observed ratio updates")

    for link, codec, want in ((1e-6, 1e-12, {"ring", "recursive_doubling"}), (1e-12, 1e-6, {"plain"})):
        autotune.use_model(None, eb, "float32", _synthetic(world, link, codec))  # slow link, cheap codec: compress
        t = data(rank)
        all_reduce(t, codec=eb, algorithm="auto")
        assert last_algorithm() in want, (link, last_algorithm())
        assert identical_on_all_ranks([ALGORITHMS.index(last_algorithm())])
        assert bounded(t, exact_sum(world), world * 2e-3)
    autotune.use_model(None, eb, "float32", None)
    done.append("auto follows the model: slow link -> compressed, fast link -> plain")
    return done


def ordering_checks(rank: int, world: int) -> list[str]:
    """A call made while an asynchronous one is pending runs after it, on every rank."""
    first = all_reduce(data(rank), codec=ErrorBounded(1e-2), algorithm="ring", async_op=True)
    second = data(rank)
    all_reduce(second, codec=ErrorBounded(1e-3), algorithm="recursive_doubling")
    third = all_reduce(data(rank), codec=Lossless(), async_op=True)
    assert bounded(first.wait(120), exact_sum(world), world * 1e-2)
    assert bounded(second, exact_sum(world), world * 1e-3)
    assert torch.equal(third.wait(120).cpu(), torch.from_numpy(exact_sum(world)).float())
    return ["asynchronous and synchronous calls keep their order"]


def run_ranks(target, world: int, args_for, timeout: float) -> list:
    """Run ``target(*args_for(rank, queue))`` in ``world`` spawned processes; what each put on the queue.

    Fails the test (never hangs) when a process dies without a result or the results are not
    all in within ``timeout`` seconds; leftover processes are killed."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=args_for(r, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results, deadline, dead_since = [], time.monotonic() + timeout, None
    try:
        while len(results) < world:
            try:
                results.append(queue.get(timeout=1.0))
                continue
            except Empty:
                pass
            now = time.monotonic()
            reported = {res[0] for res in results}  # a rank may report and then die on purpose (tests of dead peers)
            crashed = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in reported]
            dead_since = (dead_since or now) if crashed else None
            if crashed and now - dead_since > 5:  # its result, if any, had time to arrive
                pytest.fail(f"ranks {crashed} died without a result (exit codes {[p.exitcode for p in procs]})")
            if now > deadline:
                pytest.fail(f"{world - len(results)} rank(s) gave no result within {timeout:.0f} s")
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
    return results


def _compile_gpu_kernels() -> None:
    """Build the codecs' CUDA kernels before any collective: a rank compiling while its peer waits
    inside NCCL could outlast the group's timeout."""
    x = torch.zeros(64, device=DEVICE)
    for predictor in ("none", "lorenzo"):
        codec = ErrorBounded(1e-3, predictor)
        codec.decode_device(codec.encode_device(x)[0], "float32")
    Lossless().encode_device(x)
    torch.cuda.synchronize()


def run_checks(body, rank: int, world: int, init_file: str, queue, backend: str = "gloo",
               timeout_s: float = 120) -> None:
    """One rank of a multi-process test: join the group (NCCL: this rank's GPU, ``cuda:rank``, its
    kernels built first), whose timeout is ``timeout_s``, run body(rank, world), send back its result
    or its traceback."""
    global DEVICE
    if backend == "nccl":
        torch.cuda.set_device(rank)
        DEVICE = torch.device("cuda", rank)
        _compile_gpu_kernels()
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s),
                            **({"device_id": DEVICE} if backend == "nccl" else {}))
    try:
        queue.put((rank, "ok", body(rank, world)))
    except BaseException:  # noqa: BLE001 (any failure goes back to the parent as a result)
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        dist.destroy_process_group()


def worker(rank: int, world: int, init_file: str, queue, backend: str = "gloo") -> None:
    run_checks(checks, rank, world, init_file, queue, backend)

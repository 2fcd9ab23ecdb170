"""Checks run inside each rank of a process group: Gloo with CPU tensors (tests/test_collectives.py)
or NCCL with CUDA tensors (tests/test_collectives_nccl.py)."""

from __future__ import annotations

import traceback
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from visemz.collectives import ErrorBounded, Lossless, all_gather, all_reduce, all_to_all, broadcast, reduce_scatter, scatter
from visemz.errors import InvalidArgumentError

N = 10_007
DEVICE = torch.device("cpu")  # where the tensors under test live; the worker sets it


def data(rank: int, dtype=torch.float32, n: int = N) -> torch.Tensor:
    """Rank r's tensor: a smooth field plus noise (every rank can rebuild every other's)."""
    g = torch.Generator().manual_seed(1000 + rank)
    t = torch.linspace(0, 12, n, dtype=torch.float64)
    return (torch.sin(t + rank) * (rank + 1) + 0.01 * torch.randn(n, generator=g, dtype=torch.float64)).to(dtype).to(DEVICE)


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
            assert bounded(t, exact_sum(world, dtype), world * 1e-3) or (algorithm == "auto" and torch.equal(t, plain)), (
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
    assert bounded(handle.wait(), exact_sum(world), world * 1e-2)
    done.append("async all_reduce")

    for codec in (ErrorBounded(1e-3), Lossless()):
        inputs = [data(rank, n=997) * (j + 1) for j in range(world)]
        out = torch.empty(997, device=DEVICE)
        reduce_scatter(out, inputs, codec=codec)
        want = sum((data(r, n=997) * (rank + 1)).cpu().to(torch.float64).numpy() for r in range(world))  # the float32 inputs
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
        assert all(bounded(o, data(r * world + rank, n=300).cpu().to(torch.float64).numpy(), tol) for r, o in enumerate(outs))
    done.append("reduce_scatter, all_gather, broadcast, scatter, all_to_all (error-bounded and lossless)")

    if world == 1:  # nobody to disagree with
        return done
    for kwargs, what in (
        (dict(codec=ErrorBounded(1e-3 if rank == 0 else 1e-4)), "eb"),
        (dict(codec=ErrorBounded(1e-3)), "dtype"),
        (dict(codec=ErrorBounded(1e-3)), "size"),
    ):
        t = data(rank, torch.float16 if (what == "dtype" and rank == 0) else torch.float32, N + (rank if what == "size" else 0))
        try:
            all_reduce(t, **kwargs)
            raise AssertionError(f"mismatched {what} was not refused")
        except InvalidArgumentError as e:
            assert "ranks disagree" in str(e)
    done.append("mismatched eb, dtype and size refused on every rank")
    return done


def worker(rank: int, world: int, init_file: str, queue, backend: str = "gloo") -> None:
    global DEVICE
    if backend == "nccl":
        torch.cuda.set_device(rank)
        DEVICE = torch.device("cuda", rank)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60), **({"device_id": DEVICE} if backend == "nccl" else {}))
    try:
        queue.put((rank, "ok", checks(rank, world)))
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        dist.destroy_process_group()

"""CUDA tensors over Gloo, every rank on the one GPU there is (marker gpu): the device engine's
rings and doubling (lazy sums, sizes read with what arrives, decodes read together) give the
very values the host engine gives CPU tensors, and an add error on one rank reaches every rank.

A one-GPU machine runs these multi-rank device paths, which otherwise need one GPU per rank (NCCL)."""

import os

import pytest
import torch

from visemz.collectives import (
    ErrorBounded,
    Lossless,
    all_gather,
    all_reduce,
    all_to_all,
    last_algorithm,
    reduce_scatter,
    scatter,
)
from visemz.collectives import transport as T
from visemz.errors import InvalidArgumentError, LimitExceededError, PeerFailedError, PlanMismatchError

from .collective_checks import bounded, data, exact_sum, run_checks, run_ranks

pytestmark = pytest.mark.gpu
GPU = torch.device("cuda", 0)


def _same(fn, make) -> bool:
    """``fn`` run on CPU tensors and on CUDA copies of them: identical values (the engines' bytes agree)."""
    cpu = make()
    gpu = [t.to(GPU) for t in cpu]
    fn(*cpu)
    fn(*gpu)
    return all(torch.equal(c, g.cpu()) for c, g in zip(cpu, gpu))


def _device_checks(rank: int, world: int) -> list[str]:
    ErrorBounded(1e-3).encode_device(torch.zeros(64, device=GPU))  # kernels built before any collective
    done, inband_steps, real = [], [], T._exchange_inband
    T._exchange_inband = lambda *args: inband_steps.append(1) or real(*args)  # counts the in-band steps taken
    try:
        for codec in (ErrorBounded(1e-3), ErrorBounded(1e-3, "none"), ErrorBounded(1e-2, "lorenzo2d")):
            for algorithm in ("ring", "recursive_doubling"):
                shape = (97, 103) if codec.predictor == "lorenzo2d" else (10_007,)
                assert _same(lambda t: all_reduce(t, codec=codec, algorithm=algorithm),
                             lambda: [data(rank, n=97 * 103).reshape(shape) if len(shape) == 2
                                      else data(rank)]), (codec, algorithm)
    finally:
        T._exchange_inband = real
    assert bool(inband_steps) == (os.environ["VISEMZ_COLLECTIVE_INBAND_KIB"] != "0"), len(inband_steps)
    done.append("all_reduce ring and recursive doubling: CUDA over Gloo == CPU")

    t = data(rank).to(GPU)
    all_reduce(t, codec=ErrorBounded(1e-3), algorithm="auto")  # calibrates at the default sizes on this GPU
    assert bounded(t, exact_sum(world), world * 1e-3) and last_algorithm() in ("plain", "ring", "recursive_doubling")
    done.append(f"auto at the default calibration sizes chose {last_algorithm()}")

    for codec in (ErrorBounded(1e-3), Lossless()):
        assert _same(lambda out, *ins: reduce_scatter(out, list(ins), codec=codec),
                     lambda: [torch.empty(997), *(data(rank, n=997) * (j + 1) for j in range(world))]), codec
        assert _same(lambda t, *outs: all_gather(list(outs), t, codec=codec),
                     lambda: [data(rank), *(torch.empty(10_007) for _ in range(world))]), codec
        assert _same(lambda *ts: all_to_all(list(ts[:world]), list(ts[world:]), codec=codec),
                     lambda: [*(torch.empty(300) for _ in range(world)),
                              *(data(rank * world + j, n=300) for j in range(world))])
        root = world - 1
        assert _same(lambda out, *parts: scatter(out, list(parts) if rank == root else None, root, codec=codec),
                     lambda: [torch.empty(501), *(data(j, n=501) for j in range(world))]), codec
    done.append("reduce_scatter, all_gather, all_to_all, scatter: CUDA over Gloo == CPU")

    # asynchronous: a torch.futures.Future made for the GPU, its value the synchronous call's, bit for bit
    sync, t = data(rank).to(GPU), data(rank).to(GPU)
    all_reduce(sync, codec=ErrorBounded(1e-3), algorithm="ring")
    handle = all_reduce(t, codec=ErrorBounded(1e-3), algorithm="ring", async_op=True)
    doubled = handle.then(lambda fut: fut.value() * 2)
    assert isinstance(handle, torch.futures.Future) and torch.equal(handle.wait(120), sync)
    assert torch.equal(doubled.wait(), sync * 2)
    # values the codec refuses on one rank: its own error there, PeerFailedError naming it on the others
    bad = data(rank).to(GPU)
    bad[5] = float("nan") if rank == world - 1 else bad[5]
    try:
        all_reduce(bad, codec=ErrorBounded(1e-3))
        raise AssertionError("NaN on one rank was not refused")
    except (InvalidArgumentError, PeerFailedError) as e:
        assert isinstance(e, InvalidArgumentError) == (rank == world - 1) and "NaN" in str(e), (rank, e)
    done.append("async all_reduce of CUDA tensors: a Future; NaN on one rank refused on every rank")

    # a rank compressing on its GPU and one on its CPU would misread each other's streams: refused on both
    mixed = data(rank).to(GPU) if rank == 0 else data(rank)
    try:
        all_reduce(mixed, codec=ErrorBounded(1e-3), algorithm="ring")
        raise AssertionError("ranks mixing GPU and CPU engines were not refused")
    except PlanMismatchError as e:
        assert "compressed on a GPU" in str(e)
    done.append("GPU and CPU engines mixed: refused on every rank")

    if world == 3:
        # every chunk's first sum (two ranks' 1.5 * 2**30 steps) leaves int32 in the middle of the ring (and in
        # doubling's fold of the third rank): the reports travel on with the sums, and every rank raises
        t = torch.full((3 * 2048,), 1.5 * 2.0**30 * 2e-9, device=GPU)
        for algorithm in ("ring", "recursive_doubling"):
            try:
                all_reduce(t.clone(), codec=ErrorBounded(1e-9, "none"), algorithm=algorithm)
                raise AssertionError(f"{algorithm}: a sum leaving int32 was not refused")
            except LimitExceededError as e:  # the same error on every rank, whichever way the reports came
                assert "int32" in str(e), (algorithm, e)
        # reduce_scatter: only chunk 0's chain leaves int32 (its owner's sum carries the report), and every rank
        # raises it as its own (all_sizes reads the owner's report with each rank's own settle)
        ins = [t[:2048].clone() if j == 0 else torch.zeros(2048, device=GPU) for j in range(world)]
        try:
            reduce_scatter(torch.empty(2048, device=GPU), ins, codec=ErrorBounded(1e-9, "none"))
            raise AssertionError("reduce_scatter: a sum leaving int32 on chunk 0 was not refused on every rank")
        except LimitExceededError as e:
            assert "int32" in str(e), (rank, e)
        done.append("a sum leaving int32 mid-ring or mid-doubling is raised on every rank")

    if world == 2:
        # rank 0's reduced chunk (the first half: 1.5 * 2**30 steps of 2 eb on each rank) leaves int32
        # steps when summed; rank 1's (5e8 steps each) does not: both raise
        t = torch.full((4096,), 1.0, device=GPU)
        t[:2048] = 1.5 * 2.0**30 * 2e-9
        try:
            all_reduce(t, codec=ErrorBounded(1e-9, "none"), algorithm="ring")
            raise AssertionError("a sum leaving int32 was not refused")
        except LimitExceededError as e:
            assert "int32" in str(e)
        done.append("an add error on one rank's chunk is raised on every rank")
    return done


def _worker(rank: int, world: int, init_file: str, queue) -> None:
    run_checks(_device_checks, rank, world, init_file, queue, "gloo")


@pytest.mark.timeout(400)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(("world", "inband_kib"), [(2, "2048"), (3, "2048"), (2, "0"), (3, "0")])
def test_cuda_tensors_over_gloo_equal_cpu_tensors(world, inband_kib, tmp_path, monkeypatch):
    """With in-band lengths (the default; every step here in-band) and without (every step sized)."""
    pytest.importorskip("cupy")
    monkeypatch.setenv("VISEMZ_COLLECTIVE_INBAND_KIB", inband_kib)  # the spawned ranks read it at import
    results = run_ranks(_worker, world, lambda r, q: (r, world, str(tmp_path / "init"), q), timeout=360)
    errors = [f"rank {r}:\n{msg}" for r, status, msg in results if status != "ok"]
    assert not errors, "\n".join(errors)
    raised_everywhere = ["an add error on one rank's chunk is raised on every rank" in msg for _, _, msg in results]
    assert raised_everywhere == [world == 2] * world
    mid_ring = ["a sum leaving int32 mid-ring or mid-doubling is raised on every rank" in msg for _, _, msg in results]
    assert mid_ring == [world == 3] * world

"""The DDP communication hook on Gloo with two processes: it returns a torch.futures.Future (the
asynchronous all_reduce's), replicas stay identical, and training ends at the very parameters of the
same hook run synchronously (and within eb of plain DDP).  On the CPU, and (marker gpu) with both
ranks' models on the one GPU there is, where the Futures are CUDA Futures."""

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from visemz.collectives import ErrorBounded, Lossless, all_reduce, ddp_hook

from .collective_checks import run_ranks


def _synchronous_hook(codec, algorithm):
    """The hook as it was before it returned the asynchronous call's Future: the all_reduce done, then a
    completed Future (the reference the asynchronous hook must match bit for bit)."""

    def hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(all_reduce(bucket.buffer(), op="avg", group=state, codec=codec, algorithm=algorithm))
        return fut

    return hook


def _recording(hook, returned: list):
    """``hook``, noting the type of each Future it returns."""

    def recorded(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        fut = hook(state, bucket)
        returned.append(type(fut))
        return fut

    return recorded


def _train(rank, world, init, codec_name, algorithm, device, queue):
    dev = torch.device(device)
    if dev.type == "cuda":  # the codec's kernels built before any collective, so no rank waits on another's build
        torch.cuda.set_device(0)
        warm = ErrorBounded(1e-6)
        warm.decode_device(warm.encode_device(torch.zeros(64, device=dev))[0], "float32")
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        torch.manual_seed(0)
        names = ("plain", "hooked", "synchronous")
        nets = {name: torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)).to(dev)
                for name in names}
        for name in names[1:]:
            nets[name].load_state_dict(nets["plain"].state_dict())
        # small buckets: several per backward pass, so several asynchronous calls are in flight together
        on_gpu = {"device_ids": [0]} if dev.type == "cuda" else {}
        models = {name: DDP(net, bucket_cap_mb_list=[0.004] * 4, **on_gpu) for name, net in nets.items()}
        codec = {"lossless": Lossless(), "eb": ErrorBounded(1e-6)}[codec_name]
        returned = []
        models["hooked"].register_comm_hook(None, _recording(ddp_hook(codec, algorithm=algorithm), returned))
        models["synchronous"].register_comm_hook(None, _synchronous_hook(codec, algorithm))
        opts = {name: torch.optim.SGD(m.parameters(), lr=0.1) for name, m in models.items()}
        g = torch.Generator().manual_seed(rank)
        for _ in range(5):
            x, y = torch.randn(16, 32, generator=g).to(dev), torch.randn(16, 1, generator=g).to(dev)
            for name, m in models.items():
                opts[name].zero_grad()
                torch.nn.functional.mse_loss(m(x), y).backward()
                opts[name].step()
        flat = {n: torch.cat([p.detach().reshape(-1) for p in nets[n].parameters()]).cpu() for n in nets}
        everyone = [torch.empty_like(flat["hooked"]) for _ in range(world)]
        dist.all_gather(everyone, flat["hooked"])
        queue.put((rank, {"same on every rank": all(torch.equal(e, everyone[0]) for e in everyone),
                          "from plain DDP": float((flat["hooked"] - flat["plain"]).abs().max()),
                          "same as synchronous": torch.equal(flat["hooked"], flat["synchronous"]),
                          "futures": sorted({t.__name__ for t in returned}), "calls": len(returned),
                          "all futures": bool(returned) and all(issubclass(t, torch.futures.Future)
                                                                for t in returned)}))
    except BaseException as e:  # noqa: BLE001 (any failure goes back to the parent as a result)
        queue.put((rank, repr(e)))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("codec_name", "algorithm", "device"), [
    ("lossless", "ring", "cpu"), ("eb", "ring", "cpu"), ("eb", "auto", "cpu"),
    pytest.param("eb", "ring", "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                                 reason="needs a CUDA GPU")]),
])
def test_ddp_hook_returns_futures_and_trains_as_before(codec_name, algorithm, device, tmp_path):
    if device == "cuda":
        pytest.importorskip("cupy")
    results = run_ranks(_train, 2, lambda r, q: (r, 2, tmp_path / "init", codec_name, algorithm, device, q),
                        timeout=150)
    for rank, got in results:
        assert isinstance(got, dict), f"rank {rank}: {got}"
        assert got["all futures"], f"rank {rank}: the hook returned {got['futures']}"
        assert got["calls"] > 5, f"rank {rank}: {got['calls']} buckets in 5 steps"
        assert got["same on every rank"], f"rank {rank}: replicas differ"
        assert got["from plain DDP"] < 1e-5, f"rank {rank}: parameters drift {got['from plain DDP']} from plain DDP"
        if algorithm != "auto":  # auto may choose differently for two calls (its model learns): within eb only
            assert got["same as synchronous"], f"rank {rank}: the asynchronous hook trained to other parameters"

"""The DDP communication hook on Gloo with two processes: replicas stay identical, training matches plain DDP."""

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from visemz.collectives import ErrorBounded, Lossless, ddp_hook

from .collective_checks import run_ranks


def _train(rank, world, init, codec_name, algorithm, queue):
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    try:
        torch.manual_seed(0)
        nets = {name: torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)) for name in ("plain", "hooked")}
        nets["hooked"].load_state_dict(nets["plain"].state_dict())
        models = {name: DDP(net) for name, net in nets.items()}
        codec = {"lossless": Lossless(), "eb": ErrorBounded(1e-6)}[codec_name]
        models["hooked"].register_comm_hook(None, ddp_hook(codec, algorithm=algorithm))
        opts = {name: torch.optim.SGD(m.parameters(), lr=0.1) for name, m in models.items()}
        g = torch.Generator().manual_seed(rank)
        for _ in range(5):
            x, y = torch.randn(16, 32, generator=g), torch.randn(16, 1, generator=g)
            for name, m in models.items():
                opts[name].zero_grad()
                torch.nn.functional.mse_loss(m(x), y).backward()
                opts[name].step()
        flat = {n: torch.cat([p.detach().reshape(-1) for p in nets[n].parameters()]) for n in nets}
        everyone = [torch.empty_like(flat["hooked"]) for _ in range(world)]
        dist.all_gather(everyone, flat["hooked"])
        queue.put((rank, all(torch.equal(e, everyone[0]) for e in everyone), float((flat["hooked"] - flat["plain"]).abs().max())))
    except BaseException as e:  # noqa: BLE001 (any failure goes back to the parent as a result)
        queue.put((rank, repr(e), None))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("codec_name", "algorithm"), [("lossless", "ring"), ("eb", "ring"), ("eb", "auto")])
def test_ddp_hook_keeps_replicas_identical(codec_name, algorithm, tmp_path):
    results = run_ranks(_train, 2, lambda r, q: (r, 2, tmp_path / "init", codec_name, algorithm, q), timeout=150)
    for rank, same, diff in results:
        assert same is True, f"rank {rank}: {same}"
        assert diff < 1e-5, f"rank {rank}: parameters drift {diff} from plain DDP"

"""A DistributedDataParallel communication hook on visemz's compressed all_reduce.

    model = DDP(net)
    model.register_comm_hook(None, visemz.collectives.ddp_hook(Lossless()))   # or ErrorBounded(eb)

Each gradient bucket is averaged across ranks with the given codec; every rank ends with
the same averaged gradients, so the replicas stay identical.  (No postponed annotations here:
DDP checks that the hook's bucket parameter is annotated with the real dist.GradBucket.)
"""


import torch
import torch.distributed as dist

from .ops import all_reduce


def ddp_hook(codec, algorithm: str = "auto"):
    """A hook for ``DistributedDataParallel.register_comm_hook(state, hook)``; ``state`` is the group or None."""

    def hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        grads = bucket.buffer()
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        try:
            all_reduce(grads, op="avg", group=state, codec=codec, algorithm=algorithm)
            fut.set_result(grads)
        except Exception as e:  # DDP surfaces the error from the future
            fut.set_exception(e)
        return fut

    return hook

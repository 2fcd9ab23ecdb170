"""A DistributedDataParallel communication hook on visemz's compressed all_reduce.

    model = DDP(net)
    model.register_comm_hook(None, visemz.collectives.ddp_hook(Lossless()))   # or ErrorBounded(eb)

Each gradient bucket is averaged across ranks with the given codec; every rank ends with
the same averaged gradients, so the replicas stay identical.  The hook returns the asynchronous
all_reduce's ``torch.futures.Future`` (as torch's own ``allreduce_hook`` does), so DDP goes on with
the backward pass while buckets are compressed and exchanged on the collectives' background thread,
in bucket order on every rank.  (No postponed annotations here: DDP checks that the hook's bucket
parameter is annotated with the real dist.GradBucket.)
"""


import torch
import torch.distributed as dist

from .ops import all_reduce


def ddp_hook(codec, algorithm: str = "auto"):
    """A hook for ``DistributedDataParallel.register_comm_hook(state, hook)``; ``state`` is the group or None."""

    def hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        try:
            return all_reduce(bucket.buffer(), op="avg", group=state, codec=codec, algorithm=algorithm, async_op=True)
        except Exception as e:  # refused here at the call (the other ranks are told): DDP raises it from the future
            fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            fut.set_exception(e)
            return fut

    return hook

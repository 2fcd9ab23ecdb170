"""Compressed collectives: float codecs on the shared block encoder, homomorphic reduction.

Built so far (CPU path; NCCL GPU kernels are next): the codecs, the NumPy homomorphic add,
and the collectives over torch.distributed.
"""

from .codecs import ErrorBounded, Lossless
from .ddp import ddp_hook
from .homomorphic import add
from .ops import CostModel, Handle, all_gather, all_reduce, all_to_all, broadcast, reduce_scatter, scatter

__all__ = ["ErrorBounded", "Lossless", "add", "all_reduce", "reduce_scatter", "all_gather", "broadcast",
           "scatter", "all_to_all", "Handle", "CostModel", "ddp_hook"]
